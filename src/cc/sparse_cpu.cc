// CPU aggregation of gradient rows by id and sparse optimizer updates, on one of two index
// structures: bitmap ranks for ids in a narrow range (range_rank_cpu.h: rows of a table, the
// PS's case) or hash partitions for widely spread ids (dedup_cpu.h). Either way every id's rows
// are summed left to right, as in the NumPy reference, whatever the thread count.
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "cpu_target.h"
#include "dedup_cpu.h"
#include "kernels.h"
#include "range_rank_cpu.h"
#include "rows_cpu.h"
#include "update_rules.h"

namespace edl {
namespace cpu {

// On the hash dedup (dedup_cpu.h): threads take dedup partitions dynamically and walk each
// one's positions in order, so no two threads touch one row.
namespace {
// Rows ahead whose gradient (and destination) rows the passes over positions prefetch.
constexpr int64_t kRowsAhead = 8;
// Positions per dynamically scheduled block of the singleton copy.
constexpr int64_t kSingleBlock = 4096;

// Position i (of the id in slot g) into the id's output row: its first row is copied
// (streamed when it is also its only one: no read of the destination line), later rows are
// added, so duplicates are summed left to right.
inline void sum_position(const Dedup& d, int64_t i, int64_t g, const float* grads, int64_t dim, const int64_t* rank,
                         float* out, bool stream) {
  const float* __restrict src = grads + i * dim;
  float* __restrict dst = out + rank[g] * dim;
  if (d.first_pos()[g] == i) {
    if (stream && d.count()[g] == 1) {
      copy_row(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), dim * sizeof(float), true);
    } else {
      for (int64_t j = 0; j < dim; ++j) dst[j] = src[j];
    }
  } else {
    for (int64_t j = 0; j < dim; ++j) dst[j] = dst[j] + src[j];
  }
}

EDL_MULTIVERSION
void aggregate_part(const Dedup& d, int p, const float* grads, int64_t dim, const int64_t* rank, float* out,
                    bool stream, bool skip_singletons) {
  const int64_t kb = d.slot_begin(p), ke = d.slot_begin(p + 1);
  const int64_t* pos = d.positions();
  const int64_t* slot_of = d.slot_of();
  const int64_t* count = d.count();
  for (int64_t k = kb; k < ke; ++k) {
    if (k + kRowsAhead < ke) {
      const int64_t ia = pos[k + kRowsAhead];
      if (!skip_singletons || count[slot_of[ia]] > 1) {
        prefetch_rows(grads + ia * dim, dim, 0);
        if (!stream) prefetch_rows(out + rank[slot_of[ia]] * dim, dim, 1);
      }
    }
    const int64_t i = pos[k], g = slot_of[i];
    if (skip_singletons && count[g] == 1) continue;
    sum_position(d, i, g, grads, dim, rank, out, stream);
  }
}

// Rows of the ids seen once among positions [lo, hi): sequential reads.
EDL_MULTIVERSION
void copy_singletons(const Dedup& d, int64_t lo, int64_t hi, const float* grads, int64_t dim, const int64_t* rank,
                     float* out, bool stream) {
  const int64_t* slot_of = d.slot_of();
  const int64_t* count = d.count();
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t g = slot_of[i];
    if (count[g] != 1) continue;
    if (!stream && i + kRowsAhead < hi) {
      const int64_t ga = slot_of[i + kRowsAhead];
      if (count[ga] == 1) prefetch_rows(out + rank[ga] * dim, dim, 1);
    }
    copy_row(reinterpret_cast<char*>(out + rank[g] * dim), reinterpret_cast<const char*>(grads + i * dim), row_bytes,
             stream);
  }
}

// All positions in ascending order on one thread: a sequential read of the gradient rows.
// Duplicates are summed left to right, as in aggregate_part.
EDL_MULTIVERSION
void aggregate_sweep(const Dedup& d, const float* grads, int64_t dim, const int64_t* rank, float* out,
                     bool stream) {
  const int64_t n = d.n();
  const int64_t* slot_of = d.slot_of();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n) {
      const int64_t ia = i + kRowsAhead;
      prefetch_rows(grads + ia * dim, dim, 0);
      if (!stream) prefetch_rows(out + rank[slot_of[ia]] * dim, dim, 1);
    }
    sum_position(d, i, slot_of[i], grads, dim, rank, out, stream);
  }
}

template <int K>
inline void apply_row(const OptParams& p, float* table, const OptSlots& s, int64_t base, const float* __restrict g,
                      int64_t dim) {
#pragma omp simd
  for (int64_t j = 0; j < dim; ++j) apply_update<K>(p, table, s, base + j, g[j]);
}

inline void prefetch_update_rows(float* table, const OptSlots& s, int64_t base, int64_t dim) {
  prefetch_rows(table + base, dim, 1);
  if (s.s0) prefetch_rows(s.s0 + base, dim, 1);
  if (s.s1) prefetch_rows(s.s1 + base, dim, 1);
  if (s.s2) prefetch_rows(s.s2 + base, dim, 1);
}

// Fused sum + update of partition p: an id seen once is applied straight from its gradient
// row; a repeated id is summed in a buffer row and applied at its last occurrence, so the
// aggregated gradient of most rows never goes to memory.
template <int K>
EDL_MULTIVERSION void sparse_part(const OptParams& prm, float* table, int64_t dim, const int64_t* ids,
                                  const float* grads, const OptSlots& s, Dedup& d, int p, float* buf) {
  const int64_t kb = d.slot_begin(p), ke = d.slot_begin(p + 1);
  const int64_t* pos = d.positions();
  const int64_t* slot_of = d.slot_of();
  const int64_t* first = d.first_pos();
  int64_t* count = d.count();
  int64_t* brow = d.slot_aux();  // slot -> buffer row
  int64_t next_row = kb;         // partition p's buffer rows: [kb, kb + its repeated ids)
  for (int64_t k = kb; k < ke; ++k) {
    if (k + kRowsAhead < ke) {
      const int64_t ia = pos[k + kRowsAhead];
      prefetch_rows(grads + ia * dim, dim, 0);
      const int64_t ga = slot_of[ia];
      // The rows are updated at the id's last occurrence; the first is a good proxy for
      // singletons (most ids of a large batch), repeated ids are cache-hot by then anyway.
      if (first[ga] == ia) prefetch_update_rows(table, s, ids[ia] * dim, dim);
    }
    const int64_t i = pos[k], g = slot_of[i];
    const float* __restrict src = grads + i * dim;
    if (first[g] == i) {
      if (count[g] == 1) {
        apply_row<K>(prm, table, s, ids[i] * dim, src, dim);
        continue;
      }
      const int64_t b = next_row++;
      brow[g] = b;
      float* __restrict acc = buf + b * dim;
      for (int64_t j = 0; j < dim; ++j) acc[j] = src[j];
      --count[g];
    } else {
      float* __restrict acc = buf + brow[g] * dim;
      for (int64_t j = 0; j < dim; ++j) acc[j] = acc[j] + src[j];
      if (--count[g] == 0) apply_row<K>(prm, table, s, ids[i] * dim, acc, dim);
    }
  }
}
}  // namespace

// Rows of ids ranked by bitmaps (range_rank_cpu.h), for aggregation and sparse updates alike.
// Thread t walks its contiguous share of the positions once, keying each by its group; when
// only repeated ids are grouped, the same pass hands the row of every id seen once straight to
// the sink (sequential reads of the gradients). The grouped positions are then sorted by group,
// in order, and each group is summed left to right in a row buffer and handed over once.
// A sink says where a finished row goes: `single(id, row)` for an id seen once, `group(g, id,
// row)` for group g, and `prefetch(id)` for the row of an id seen once, about to come.
namespace {
// Grouped positions per dynamically scheduled block of the group sums.
constexpr int64_t kGroupBlock = 2048;
// Positions ahead whose rows the group sums prefetch: their reads are random, so enough rows
// must be in flight to cover memory latency, but not so many that they evict each other.
constexpr int32_t kGroupRowsAhead = 32;

// Aggregation: row -> out[rank of the id], written once (streaming stores when whole lines).
struct ToOutput {
  const RangeRank& rr;
  float* out;
  int64_t dim;
  bool stream;
  void prefetch(int64_t id) const {
    if (!stream) prefetch_rows(out + rr.rank(id) * dim, dim, 1);
  }
  void single(int64_t id, const float* row) const { put(rr.rank(id), row); }
  void group(int32_t g, int64_t, const float* row) const { put(rr.group_row(g), row); }
  void put(int64_t r, const float* row) const {
    copy_row(reinterpret_cast<char*>(out + r * dim), reinterpret_cast<const char*>(row),
             static_cast<size_t>(dim) * sizeof(float), stream);
  }
};

// Sparse update with optimizer K: row -> applied to table row `id` (and its slots).
template <int K>
struct ToTable {
  const OptParams& p;
  float* table;
  const OptSlots& s;
  int64_t dim;
  void prefetch(int64_t id) const { prefetch_update_rows(table, s, id * dim, dim); }
  void single(int64_t id, const float* row) const { apply_row<K>(p, table, s, id * dim, row, dim); }
  void group(int32_t, int64_t id, const float* row) const { apply_row<K>(p, table, s, id * dim, row, dim); }
};

template <typename Sink>
EDL_MULTIVERSION void key_positions(RangeRank& rr, int64_t lo, int64_t hi, const float* grads, int64_t dim,
                                    int32_t* counts, const Sink& sink) {
  const int64_t* ids = rr.ids();
  int32_t* key = rr.group_key();
  if (rr.groups_all()) {  // rows are read by the group sums only
    for (int64_t i = lo; i < hi; ++i) {
      const int32_t g = rr.group_of(ids[i]);
      key[i] = g;
      ++counts[g];
    }
    return;
  }
  for (int64_t i = lo; i < hi; ++i) {
    if (i + kRowsAhead < hi && !rr.repeated(ids[i + kRowsAhead])) {
      prefetch_rows(grads + (i + kRowsAhead) * dim, dim, 0);
      sink.prefetch(ids[i + kRowsAhead]);
    }
    const int64_t id = ids[i];
    if (!rr.repeated(id)) {
      sink.single(id, grads + i * dim);
      key[i] = -1;
    } else {
      const int32_t g = rr.group_of(id);
      key[i] = g;
      ++counts[g];
    }
  }
}

// Groups [g0, g1): a group of one position goes straight from its row, a larger one is summed
// left to right in `acc`; either way the sink gets it once.
template <typename Sink>
EDL_MULTIVERSION void sum_groups(const RangeRank& rr, int32_t g0, int32_t g1, const float* grads, int64_t dim,
                                 float* __restrict acc, const Sink& sink) {
  const int64_t* ids = rr.ids();
  const int32_t* begin = rr.group_begin();
  const int32_t* pos = rr.grouped_positions();
  const int32_t end = begin[g1];
  int32_t k = begin[g0];
  for (int32_t g = g0; g < g1; ++g) {
    const int32_t e = begin[g + 1];
    const int64_t id = ids[pos[k]];
    const float* row = acc;
    for (; k < e; ++k) {
      if (k + kGroupRowsAhead < end) prefetch_rows(grads + int64_t{pos[k + kGroupRowsAhead]} * dim, dim, 0);
      const float* __restrict src = grads + int64_t{pos[k]} * dim;
      if (k == begin[g]) {
        if (e - k == 1) {
          row = src;
        } else {
          for (int64_t j = 0; j < dim; ++j) acc[j] = src[j];
        }
      } else {
        for (int64_t j = 0; j < dim; ++j) acc[j] = acc[j] + src[j];
      }
    }
    sink.group(g, id, row);
  }
}

// The whole pass, on rr.threads() threads; out_ids (optional) gets the sorted unique ids.
template <typename Sink>
void ranked_rows(RangeRank& rr, const float* grads, int64_t dim, int64_t* out_ids, const Sink& sink) {
  const int T = rr.threads();
  const int64_t n = rr.n();
  const int64_t acc_stride = (dim + 15) / 16 * 16;  // a row buffer per thread, on its own lines
  float* acc = rr.float_buffer(acc_stride * T);
#pragma omp parallel num_threads(T) if (T > 1)
  {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    const int64_t per = (n + team - 1) / team;
    if (out_ids != nullptr) rr.write_sorted_ids(t, team, out_ids);
    int32_t* counts = rr.begin_counting(t);
    key_positions(rr, std::min(n, per * t), std::min(n, per * (t + 1)), grads, dim, counts, sink);
#pragma omp barrier
    rr.group_positions(t, team, per);
    // Blocks of about kGroupBlock grouped positions; a group belongs to the block it starts in.
    const int32_t G = rr.num_groups();
    const int32_t* begin = rr.group_begin();
    const int64_t blocks = (int64_t{begin[G]} + kGroupBlock - 1) / kGroupBlock;
    auto first_group_from = [&](int64_t at) {
      return static_cast<int32_t>(std::lower_bound(begin, begin + G, at) - begin);
    };
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t b = 0; b < blocks; ++b) {
      sum_groups(rr, first_group_from(b * kGroupBlock), first_group_from((b + 1) * kGroupBlock), grads, dim,
                 acc + acc_stride * t, sink);
    }
#if defined(__SSE2__)
    _mm_sfence();  // streaming stores of a sink, if any, are visible before the region ends
#endif
  }
}

}  // namespace

void aggregate_rows(RangeRank& rr, const float* grads, int64_t dim, int64_t* out_ids, float* out) {
  ranked_rows(rr, grads, dim, out_ids, ToOutput{rr, out, dim, stream_rows(out, dim, rr.num_unique())});
}

void aggregate_rows(Dedup& d, const float* grads, int64_t dim, int64_t* out_ids, float* out) {
  follow_load();
  int64_t* rank = d.slot_aux();
  d.sort_unique(out_ids, rank);  // sorted output ids: only the unique ids are sorted
  const int P = d.parts();
  const bool stream = stream_rows(out, dim, d.num_unique());  // rows land at random places
  if (P == 1 || !d.parallel()) {
    // One thread: one sequential sweep of all positions, which the hardware prefetcher follows
    // (walking the partitions one by one reads the rows in a random order).
    aggregate_sweep(d, grads, dim, rank, out, stream);
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
    return;
  }
  // Several threads: partitions taken dynamically, not a sweep of all positions per thread
  // (the threads' rows interleave row by row, and each core's prefetcher fetches the other's).
  // Mostly distinct ids (at least half the positions unique): the rows of ids seen once need
  // no order, so they are copied in contiguous blocks of positions (sequential reads) and only
  // repeated ids go by partition. Skewed batches (few singletons) skip the extra sweep.
  const int64_t n = d.n();
  const bool split = 2 * d.num_unique() >= n;
  const int64_t blocks = split ? (n + kSingleBlock - 1) / kSingleBlock : 0;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t b = 0; b < blocks; ++b)
      copy_singletons(d, b * kSingleBlock, std::min(n, (b + 1) * kSingleBlock), grads, dim, rank, out, stream);
#pragma omp for schedule(dynamic, 1) nowait
    for (int p = 0; p < P; ++p) aggregate_part(d, p, grads, dim, rank, out, stream, split);
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
  }
}

int64_t sparse_update(const OptParams& p, float* table, int64_t rows, int64_t dim, const int64_t* ids,
                      int64_t n, const float* grads, const OptSlots& s) {
  follow_load();
  if (auto rr = RangeRank::build(ids, n)) {  // ids are rows: a narrow range unless the table is sparse
    // The bitmaps measured the ids' range: the pass that finds a bad id runs only if one exists.
    if (rr->min_id() < 0 || rr->max_id() >= rows) return first_bad_id(ids, n, rows);
    dispatch_kind(p.kind, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      ranked_rows(*rr, grads, dim, nullptr, ToTable<K>{p, table, s, dim});
    });
    return -1;
  }
  const int64_t bad = first_bad_id(ids, n, rows);
  if (bad >= 0) return bad;
  Dedup d(ids, n);
  float* buf = d.float_buffer(n * dim);  // rows used only by repeated ids (pages touched lazily)
  const int P = d.parts();
  dispatch_kind(p.kind, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
#pragma omp parallel for schedule(dynamic, 1) if (P > 1 && d.parallel())
    for (int q = 0; q < P; ++q) sparse_part<K>(p, table, dim, ids, grads, s, d, q, buf);
  });
  return -1;
}

namespace {
// Positions per dynamically scheduled block of the update of unique ids.
constexpr int64_t kUniqueBlock = 2048;

template <int K>
EDL_MULTIVERSION void update_unique_block(const OptParams& p, float* table, int64_t dim, const int64_t* ids,
                                          int64_t lo, int64_t hi, const float* grads, const OptSlots& s) {
  for (int64_t i = lo; i < hi; ++i) {
    if (i + kRowsAhead < hi) {
      prefetch_rows(grads + (i + kRowsAhead) * dim, dim, 0);
      prefetch_update_rows(table, s, ids[i + kRowsAhead] * dim, dim);
    }
    apply_row<K>(p, table, s, ids[i] * dim, grads + i * dim, dim);
  }
}
}  // namespace

int64_t sparse_update_unique(const OptParams& p, float* table, int64_t rows, int64_t dim, const int64_t* ids,
                             int64_t n, const float* grads, const OptSlots& s) {
  follow_load();
  const int64_t bad = first_bad_id(ids, n, rows);
  if (bad >= 0) return bad;
  // No id repeats (the caller's guarantee), so each position is its row's whole update and no
  // two threads share a row: blocks of positions in any order, with no ranking or grouping.
  const int64_t blocks = (n + kUniqueBlock - 1) / kUniqueBlock;
  dispatch_kind(p.kind, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
#pragma omp parallel for schedule(dynamic, 1) if (n * dim > kParallelMin)
    for (int64_t b = 0; b < blocks; ++b)
      update_unique_block<K>(p, table, dim, ids, b * kUniqueBlock, std::min(n, (b + 1) * kUniqueBlock), grads, s);
  });
  return -1;
}

}  // namespace cpu
}  // namespace edl
