// Hash deduplication of a batch of int64 ids on the CPU: the core of the sparse optimizers
// and of gradient aggregation of widely spread ids (sparse_cpu.cc; ids in a narrow range are
// ranked with bitmaps instead, range_rank_cpu.h).
//
// Ids are first bucketed by hash into P partitions (a stable counting sort of positions; P is
// a power of two, about one partition per 2k ids). Each partition then gets its own small
// open-addressing table (linear probing, multiplicative hash, capacity >= 2x its ids, int64
// keys, so it stays in L2) that maps each id to a dense "slot" in one pass: no sort of the
// ids. Partitions are independent, so threads take them dynamically (a thread that the shared
// machine descheduled does not hold up the others), and every occurrence of an id lands in
// the same partition, listed in original order: a thread that walks one partition's
// positions sums duplicates left to right, exactly like the sequential NumPy reference,
// without locks and whatever the thread count.
//
// Slots of partition p are [slot_begin(p), slot_begin(p) + unique_in(p)); ranges of different
// partitions do not touch but leave gaps (a partition's range is sized by its positions, not
// its unique ids), so per-slot arrays are sized n.
// Scratch memory comes from a process-wide pool and is reused across calls (growing only),
// so steady-state calls allocate nothing; concurrent calls get separate scratch.
#pragma once

#include <cstdint>

namespace edl {
namespace cpu {

struct DedupScratch;

class Dedup {
 public:
  static constexpr int kMaxParts = 256;

  // Maps ids[0..n) to slots and counts the occurrences of each.
  explicit Dedup(const int64_t* ids, int64_t n);
  ~Dedup();
  Dedup(const Dedup&) = delete;
  Dedup& operator=(const Dedup&) = delete;

  int64_t n() const { return n_; }
  int64_t num_unique() const { return num_unique_; }
  int parts() const { return parts_; }
  // Whether the passes over this batch run on a team (large batches with several threads).
  bool parallel() const { return parallel_; }
  int64_t slot_begin(int p) const { return part_begin_[p]; }
  int64_t unique_in(int p) const { return part_unique_[p]; }
  int64_t min_id() const { return min_id_; }
  int64_t max_id() const { return max_id_; }

  // Per position i: the slot of ids[i].
  const int64_t* slot_of() const { return slot_of_; }
  // Positions of partition p, ascending: positions()[slot_begin(p) .. slot_begin(p + 1)).
  const int64_t* positions() const { return pos_; }
  // Per slot: first position holding its id, and the id itself.
  const int64_t* first_pos() const { return first_pos_; }
  const int64_t* slot_id() const { return slot_id_; }
  // Per slot: occurrences of its id; writable so callers can count down.
  int64_t* count() const { return count_; }
  // A free per-slot int64 array (sized n) and a float buffer of at least `floats` elements,
  // both owned by the scratch of this call.
  int64_t* slot_aux() const { return slot_aux_; }
  float* float_buffer(int64_t floats);
  // Sorts the unique ids: writes them ascending to sorted_ids[0..num_unique) and the rank of
  // every slot to rank[slot] (rank may be slot_aux()).
  void sort_unique(int64_t* sorted_ids, int64_t* rank);

 private:
  DedupScratch* s_;
  int64_t n_ = 0, num_unique_ = 0;
  int parts_ = 1;
  bool parallel_ = false;
  int64_t part_begin_[kMaxParts + 1] = {};
  int64_t part_unique_[kMaxParts] = {};
  int64_t min_id_ = 0, max_id_ = 0;
  int64_t *slot_of_ = nullptr, *pos_ = nullptr, *first_pos_ = nullptr, *slot_id_ = nullptr, *count_ = nullptr;
  int64_t* slot_aux_ = nullptr;
  uint8_t* part_of_pos_ = nullptr;  // per position: its partition (kMaxParts <= 256)
};

}  // namespace cpu
}  // namespace edl
