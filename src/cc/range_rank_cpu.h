// Ranks of a batch of int64 ids that lie in a narrow range [min, max] -- row indices into a
// table, the parameter server's usual case -- found with bitmaps instead of the hashing and
// sorting of dedup_cpu.h. Used by gradient aggregation and the sparse
// optimizers (sparse_cpu.cc).
//
// Every thread marks its contiguous share of the positions in two bitmaps over [min, max]:
// "seen" and "seen again". Merged (an id is repeated when one thread saw it twice or two
// threads each saw it), with a popcount prefix per 64-bit word, they give everything at once:
// the sorted unique ids are the set bits read in order, and the rank of an id among them (its
// output row) is the set bits below it -- one word, one prefix, one popcount, no search. The
// repeated ids get a second rank among themselves the same way.
//
// Summing needs each id's positions in order. When most positions hold ids seen once (a large
// batch over a large table), only the repeated ids are "grouped": their positions are sorted
// into groups (a stable counting sort, group_positions) while the rows of the ids seen once
// are copied in any order, in a sequential pass. When most positions repeat (skewed ids),
// every id is grouped, so each gradient row is read exactly once, by the group sums.
//
// The bitmaps cost one word per 64 ids of the range per thread, so build() takes a batch only
// while that is within a few words per id; wider (e.g. hashed) ids go to Dedup.
// Scratch comes from a process-wide pool (scratch_cpu.h), as for Dedup.
#pragma once

#include <cstdint>
#include <memory>

namespace edl {
namespace cpu {

struct RangeRankScratch;

class RangeRank {
 public:
  // The ranks of ids[0..n), or nullptr when the range is too wide for bitmaps (or n is 0 or
  // does not fit int32 positions). The caller keeps ids alive while the object lives.
  static std::unique_ptr<RangeRank> build(const int64_t* ids, int64_t n);
  ~RangeRank();
  RangeRank(const RangeRank&) = delete;
  RangeRank& operator=(const RangeRank&) = delete;

  const int64_t* ids() const { return ids_; }
  int64_t n() const { return n_; }
  int64_t num_unique() const { return num_unique_; }
  int64_t min_id() const { return min_id_; }
  int64_t max_id() const { return max_id_; }
  // The team size for the passes that follow: the bitmaps' team, fewer when the groups are
  // so many that per-thread group counters would outweigh the positions (many-core hosts).
  int threads() const { return threads_; }

  bool repeated(int64_t id) const {
    const uint64_t k = key(id);
    return (dup_[k >> 6] >> (k & 63)) & 1;
  }
  // Rank among the unique ids (sorted ascending) of an id of the batch.
  int64_t rank(int64_t id) const {
    const uint64_t k = key(id);
    return seen_rank_[k >> 6] + __builtin_popcountll(seen_[k >> 6] & ((uint64_t{1} << (k & 63)) - 1));
  }
  // Whether every id is grouped (else only the repeated ones), the number of groups, the group
  // of a grouped id and the output row (rank) of a group.
  bool groups_all() const { return groups_all_; }
  int32_t num_groups() const { return groups_all_ ? static_cast<int32_t>(num_unique_) : num_repeated_; }
  int32_t group_of(int64_t id) const {
    if (groups_all_) return static_cast<int32_t>(rank(id));
    const uint64_t k = key(id);
    return dup_rank_[k >> 6] + __builtin_popcountll(dup_[k >> 6] & ((uint64_t{1} << (k & 63)) - 1));
  }
  int64_t group_row(int32_t g) const { return groups_all_ ? g : rank_of_repeated_[g]; }

  // The collective steps below are called inside one OpenMP parallel region by each of its
  // `team` threads (thread t), team <= threads().
  // Writes thread t's share of the sorted unique ids to out[0..num_unique).
  void write_sorted_ids(int t, int team, int64_t* out) const;
  // Thread t's counters of groups, zeroed. A pass over thread t's share of the positions
  // (`per_thread` positions each, in thread order) counts there the positions of each group
  // and stores at group_key()[i] the group of position i (-1: not grouped).
  int32_t* begin_counting(int t);
  int32_t* group_key() const { return key_of_pos_; }
  // After every thread's counting pass: sorts the grouped positions by group, each group in
  // ascending position order. Contains barriers; returns after the last.
  void group_positions(int t, int team, int64_t per_thread);
  // Group g is grouped_positions()[group_begin()[g] .. group_begin()[g + 1]).
  const int32_t* group_begin() const { return group_begin_; }
  const int32_t* grouped_positions() const { return order_; }
  // A float buffer of at least `floats` elements, 64-byte aligned, owned by the scratch.
  float* float_buffer(int64_t floats);

 private:
  RangeRank(RangeRankScratch* s, const int64_t* ids, int64_t n, int64_t min_id, int64_t max_id, uint64_t words,
            int threads);
  uint64_t key(int64_t id) const { return static_cast<uint64_t>(id) - static_cast<uint64_t>(min_id_); }
  void mark_and_merge();

  RangeRankScratch* s_;
  const int64_t* ids_;
  int64_t n_, min_id_, max_id_;
  uint64_t words_;
  int threads_;
  int64_t num_unique_ = 0;
  int32_t num_repeated_ = 0;
  bool groups_all_ = false;
  uint64_t *seen_ = nullptr, *dup_ = nullptr;  // merged bitmaps (thread 0's)
  int32_t* seen_rank_ = nullptr;               // per word: set bits of seen_ before it
  int32_t* dup_rank_ = nullptr;                // per word: set bits of dup_ before it
  int64_t* rank_of_repeated_ = nullptr;       // per repeat rank: rank among the unique ids
  int32_t *key_of_pos_ = nullptr, *counts_ = nullptr, *group_begin_ = nullptr, *order_ = nullptr;
  static constexpr int kMaxThreads = 256;
  int32_t part_[2][kMaxThreads] = {};  // per thread: its share of the collective scans
};

}  // namespace cpu
}  // namespace edl
