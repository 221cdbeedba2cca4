// Bitmap ranks of id batches in a narrow range (see range_rank_cpu.h).
#include "range_rank_cpu.h"

#include <omp.h>

#include <algorithm>
#include <climits>

#include "cpu_target.h"
#include "kernels.h"
#include "scratch_cpu.h"

namespace edl {
namespace cpu {

namespace {
// build() takes a batch while the bitmaps of all threads hold at most this many words per id
// (plus kSlackWords): their clearing and merging then cost less than the per-id work, so the
// bitmaps beat hashing (where the limit was measured: RESULTS.md).
constexpr uint64_t kWordsPerId = 4;
constexpr uint64_t kSlackWords = 4096;
// Smaller batches are ranked on one thread (a team's fork/join would cost more).
constexpr int64_t kParallelMin = 16384;
// The passes after the bitmaps use at most this many group counters (summed over threads)
// per position: a batch of ids each seen twice has n/2 groups, so 8 threads at most.
constexpr int64_t kCountersPerPosition = 4;

// Smallest and largest id (AVX2 compares and blends 4 at a time in the cloned version).
EDL_MULTIVERSION
void id_range(const int64_t* ids, int64_t n, int64_t* lo_out, int64_t* hi_out) {
  int64_t lo = ids[0], hi = ids[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = ids[i] < lo ? ids[i] : lo;
    hi = ids[i] > hi ? ids[i] : hi;
  }
  *lo_out = lo;
  *hi_out = hi;
}

// [begin, end) of part t of `total` items split into `parts` contiguous parts.
template <typename T>
inline void share(T total, int t, int parts, T* begin, T* end) {
  const T per = (total + parts - 1) / parts;
  *begin = std::min<T>(total, per * t);
  *end = std::min<T>(total, *begin + per);
}

// Words [w0, w1) of every thread's bitmap pair (seen, dup; 2 * W words per thread) merged into
// thread 0's pair; returns the set bits of the merged seen and dup words. (Popcount loops are
// multiversioned: baseline x86-64 has no popcnt instruction and calls libgcc.)
EDL_MULTIVERSION
void merge_words(uint64_t* bits, uint64_t W, int team, uint64_t w0, uint64_t w1, int32_t* n_seen, int32_t* n_dup) {
  int32_t ns = 0, nd = 0;
  for (uint64_t w = w0; w < w1; ++w) {
    uint64_t s = bits[w], d = bits[W + w];
    for (int q = 1; q < team; ++q) {
      const uint64_t sq = bits[2 * W * q + w];
      d |= bits[2 * W * q + W + w] | (s & sq);
      s |= sq;
    }
    bits[w] = s;
    bits[W + w] = d;
    ns += __builtin_popcountll(s);
    nd += __builtin_popcountll(d);
  }
  *n_seen = ns;
  *n_dup = nd;
}

// Prefix counts of words [w0, w1), starting at r (seen) and q (dup); with rank_of_repeated,
// also the rank among the unique ids of every repeated id.
EDL_MULTIVERSION
void prefix_words(const uint64_t* seen, const uint64_t* dup, uint64_t w0, uint64_t w1, int32_t r, int32_t q,
                  int32_t* seen_rank, int32_t* dup_rank, int64_t* rank_of_repeated) {
  for (uint64_t w = w0; w < w1; ++w) {
    seen_rank[w] = r;
    dup_rank[w] = q;
    const uint64_t s = seen[w];
    if (rank_of_repeated != nullptr) {
      for (uint64_t d = dup[w]; d != 0; d &= d - 1) {
        rank_of_repeated[q++] = r + __builtin_popcountll(s & ((d & (~d + 1)) - 1));
      }
    } else {
      q += __builtin_popcountll(dup[w]);
    }
    r += __builtin_popcountll(s);
  }
}
}  // namespace

struct RangeRankScratch {
  Buf<uint64_t> bits;  // per thread: seen and seen-again bitmaps; thread 0's hold the merge
  Buf<int32_t> seen_rank, dup_rank, key_of_pos, counts, group_begin, order;
  Buf<int64_t> rank_of_repeated;
  Buf<float> floats;
  size_t bytes() const {
    return bits.bytes() + seen_rank.bytes() + dup_rank.bytes() + key_of_pos.bytes() + counts.bytes() +
           group_begin.bytes() + order.bytes() + rank_of_repeated.bytes() + floats.bytes();
  }
};

std::unique_ptr<RangeRank> RangeRank::build(const int64_t* ids, int64_t n) {
  if (n <= 0 || n >= INT32_MAX) return nullptr;
  follow_load();
  int64_t lo, hi;
  id_range(ids, n, &lo, &hi);
  const uint64_t words = ((static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo)) >> 6) + 1;
  const int threads = n >= kParallelMin ? std::min(omp_get_max_threads(), kMaxThreads) : 1;
  if (words > (kWordsPerId * static_cast<uint64_t>(n) + kSlackWords) / static_cast<uint64_t>(threads)) return nullptr;
  std::unique_ptr<RangeRank> r(
      new RangeRank(ScratchPool<RangeRankScratch>::acquire(), ids, n, lo, hi, words, threads));
  r->mark_and_merge();
  return r;
}

RangeRank::RangeRank(RangeRankScratch* s, const int64_t* ids, int64_t n, int64_t min_id, int64_t max_id,
                     uint64_t words, int threads)
    : s_(s), ids_(ids), n_(n), min_id_(min_id), max_id_(max_id), words_(words), threads_(threads) {}

RangeRank::~RangeRank() { ScratchPool<RangeRankScratch>::release(s_); }

float* RangeRank::float_buffer(int64_t floats) {
  // Rounded up to whole lines, and 16 floats of slack to align the start to 64 bytes.
  float* p = s_->floats.get(static_cast<size_t>(std::max<int64_t>(floats, 1)) + 16);
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

void RangeRank::mark_and_merge() {
  const uint64_t W = words_;
  uint64_t* bits = s_->bits.get(2 * W * static_cast<uint64_t>(threads_));
  seen_ = bits;
  dup_ = bits + W;
  seen_rank_ = s_->seen_rank.get(W);
  dup_rank_ = s_->dup_rank.get(W);
  int64_t* rank_of_repeated = s_->rank_of_repeated.get(static_cast<size_t>(n_ / 2 + 1));  // 2+ positions each
  int used = threads_;
#pragma omp parallel num_threads(threads_) if (threads_ > 1)
  {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    // 1. Thread t marks its share of the positions in its own pair of bitmaps.
    uint64_t* seen = bits + 2 * W * t;
    uint64_t* dup = seen + W;
    std::fill(seen, seen + 2 * W, 0);
    int64_t i0, i1;
    share<int64_t>(n_, t, team, &i0, &i1);
    for (int64_t i = i0; i < i1; ++i) {
      const uint64_t k = key(ids_[i]);
      const uint64_t bit = uint64_t{1} << (k & 63);
      dup[k >> 6] |= seen[k >> 6] & bit;
      seen[k >> 6] |= bit;
    }
#pragma omp barrier
    // 2. Its share of the words: every thread's bitmaps merged into thread 0's, bits counted.
    uint64_t w0, w1;
    share<uint64_t>(W, t, team, &w0, &w1);
    merge_words(bits, W, team, w0, w1, &part_[0][t], &part_[1][t]);
#pragma omp barrier
    // 3. Totals and prefix counts per word; the ranks of the repeated ids unless all ids are
    // grouped (most positions repeat: then the singletons' separate pass would cost more).
    int32_t r = 0, q = 0, u = 0, d = 0;
    for (int p = 0; p < team; ++p) {
      if (p < t) r += part_[0][p], q += part_[1][p];
      u += part_[0][p];
      d += part_[1][p];
    }
    const bool all = 2 * (static_cast<int64_t>(u) - d) < n_;
    prefix_words(seen_, dup_, w0, w1, r, q, seen_rank_, dup_rank_, all ? nullptr : rank_of_repeated);
    if (t == 0) {
      num_unique_ = u;
      num_repeated_ = d;
      groups_all_ = all;
      used = team;
    }
  }
  // Every thread of the keying pass counts into its own array of a counter per group (and the
  // grouping walks them all): keep those at most kCountersPerPosition per position.
  const int64_t cap = kCountersPerPosition * n_ / (static_cast<int64_t>(num_groups()) + 1);
  threads_ = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(used, cap)));
  rank_of_repeated_ = groups_all_ ? nullptr : rank_of_repeated;
  const size_t m = static_cast<size_t>(n_), groups = static_cast<size_t>(num_groups());
  key_of_pos_ = s_->key_of_pos.get(m);
  order_ = s_->order.get(m);
  group_begin_ = s_->group_begin.get(groups + 1);
  counts_ = s_->counts.get((groups + 1) * static_cast<size_t>(threads_));
}

void RangeRank::write_sorted_ids(int t, int team, int64_t* out) const {
  uint64_t w0, w1;
  share<uint64_t>(words_, t, team, &w0, &w1);
  const uint64_t base = static_cast<uint64_t>(min_id_);
  for (uint64_t w = w0; w < w1; ++w) {
    int64_t r = seen_rank_[w];
    for (uint64_t x = seen_[w]; x != 0; x &= x - 1) {
      out[r++] = static_cast<int64_t>(base + (w << 6) + static_cast<uint64_t>(__builtin_ctzll(x)));
    }
  }
}

int32_t* RangeRank::begin_counting(int t) {
  const size_t stride = static_cast<size_t>(num_groups()) + 1;
  int32_t* c = counts_ + stride * static_cast<size_t>(t);
  std::fill(c, c + stride, 0);
  return c;
}

void RangeRank::group_positions(int t, int team, int64_t per_thread) {
  const int32_t G = num_groups();
  const size_t stride = static_cast<size_t>(G) + 1;
  // Group r starts after all smaller groups; inside it thread 0's positions come first, then
  // thread 1's, ...: with each thread's positions ascending, the groups come out stable.
  int32_t r0, r1;
  share<int32_t>(G, t, team, &r0, &r1);
  int32_t sum = 0;
  for (int32_t r = r0; r < r1; ++r)
    for (int q = 0; q < team; ++q) sum += counts_[stride * q + r];
  part_[0][t] = sum;
#pragma omp barrier
  int32_t at = 0;
  for (int p = 0; p < t; ++p) at += part_[0][p];
  for (int32_t r = r0; r < r1; ++r) {
    group_begin_[r] = at;
    for (int q = 0; q < team; ++q) {
      int32_t& c = counts_[stride * q + r];
      const int32_t k = c;
      c = at;  // becomes thread q's fill pointer in group r
      at += k;
    }
  }
  if (t == team - 1) group_begin_[G] = at;
#pragma omp barrier
  int32_t* fill = counts_ + stride * t;
  const int64_t i0 = std::min(n_, per_thread * t), i1 = std::min(n_, i0 + per_thread);
  for (int64_t i = i0; i < i1; ++i) {
    const int32_t r = key_of_pos_[i];
    if (r >= 0) order_[fill[r]++] = static_cast<int32_t>(i);
  }
#pragma omp barrier
}

}  // namespace cpu
}  // namespace edl
