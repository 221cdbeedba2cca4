// CPU kernels: OpenMP across rows/elements; inner loops are plain contiguous loops
// that GCC vectorises. Hot element-wise loops are cloned for AVX2 and picked at load
// time (function multiversioning), so the wheel still runs on any x86-64.
#include <omp.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu_target.h"
#include "dedup_cpu.h"
#include "kernels.h"
#include "range_rank_cpu.h"
#include "update_rules.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace edl {
namespace cpu {
namespace {

// Below this many touched elements a kernel runs on one thread: the fork/join costs more.
constexpr int64_t kParallelMin = 1 << 15;

inline bool bad_id(int64_t id, int64_t rows) { return id < 0 || id >= rows; }

// First position of an id outside [0, rows), or -1.
int64_t first_bad_id(const int64_t* ids, int64_t n, int64_t rows) {
  int64_t bad = INT64_MAX;
#pragma omp parallel for reduction(min : bad) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    if (bad_id(ids[i], rows) && i < bad) bad = i;
  }
  return bad == INT64_MAX ? -1 : bad;
}

}  // namespace

namespace {
// The team size OpenMP would use (OMP_NUM_THREADS or the CPUs), read once at load time:
// follow_load() lowers the calling thread's nthreads-var, so omp_get_max_threads() no longer
// tells the maximum afterwards.
const int g_max_threads = omp_get_max_threads();
// follow_load() re-reads the load average at most this often (it is a read of /proc/loadavg).
constexpr int64_t kLoadPollNs = 100 * 1000 * 1000;
std::atomic<int64_t> g_load_read_ns{INT64_MIN};
std::atomic<int> g_team{0};

int64_t coarse_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);  // vDSO: no system call
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Threads to use now: the CPUs minus the runnable tasks of OTHER processes, taken from the
// 1-minute load average. This process counts ~1 towards it while it works (a PS or a
// benchmark loop runs the kernels back to back), hence "- 0.5" rather than a full core per
// unit of load: load 1.0 on 2 CPUs -> 2 threads, 1.6 -> 1, 6 -> 1.
int team_for_load() {
  const int64_t now = coarse_now_ns();
  const int cached = g_team.load(std::memory_order_relaxed);
  if (cached > 0 && now - g_load_read_ns.load(std::memory_order_relaxed) < kLoadPollNs) return cached;
  double load1 = 0.0;
  int team = g_max_threads;
  if (getloadavg(&load1, 1) == 1) {
    const double busy = std::floor(load1 - 0.5);
    team = static_cast<int>(std::max(1.0, std::min<double>(g_max_threads, g_max_threads - std::max(0.0, busy))));
  }
  g_team.store(team, std::memory_order_relaxed);
  g_load_read_ns.store(now, std::memory_order_relaxed);
  return team;
}
}  // namespace

int num_threads() { return g_max_threads; }

void follow_load() {
  // Unless the user chose (OMP_DYNAMIC set), size each team by the CPUs that are actually
  // free. On an oversubscribed host a second thread only adds a wake-up that waits for a time
  // slice (measured: 10-50 ms per parallel region at load 8 on 2 cores) to a kernel that takes
  // a few ms. libgomp's own dynamic mode (used before) subtracts the 15-MINUTE load average
  // rounded up from 0.9, so on 2 CPUs it ran one thread for a quarter of an hour after any
  // burst and at a steady load of 1 (one CPU idle): 2 threads are 1.3-1.9x faster there.
  // nthreads-var is per calling thread, hence set on every entry (a thread-local store).
  static const bool user_set = std::getenv("OMP_DYNAMIC") != nullptr;
  if (user_set) return;
  omp_set_dynamic(0);
  omp_set_num_threads(team_for_load());
}

namespace {
// Rows per thread that the gather prefetches ahead. Each 256-byte row is 4 cache lines, so
// ~kPrefetchRows*4 misses are in flight per core: enough to cover DRAM latency on random rows.
constexpr int64_t kPrefetchRows = 8;
// Outputs at least this large are written with non-temporal stores: they do not fit in cache
// anyway, and streaming stores skip the read-for-ownership of every destination line.
constexpr size_t kStreamMinBytes = size_t{4} << 20;
// Positions per dynamically scheduled block of the gather.
constexpr int64_t kLookupBlock = 4096;

inline void prefetch_row(const char* r, size_t row_bytes) {
  for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(r + b, 0, 3);
}

inline void copy_row(char* dst, const char* src, size_t row_bytes, bool stream) {
#if defined(__SSE2__)
  if (stream) {  // dst 16-byte aligned and row_bytes % 16 == 0 (checked by the caller)
    for (size_t b = 0; b < row_bytes; b += 64) {
      const __m128i a0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + b));
      const __m128i a1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + b + 16));
      const __m128i a2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + b + 32));
      const __m128i a3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + b + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + b), a0);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + b + 16), a1);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + b + 32), a2);
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + b + 48), a3);
    }
    return;
  }
#endif
  (void)stream;
  std::memcpy(dst, src, row_bytes);
}
}  // namespace

int64_t lookup(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids, int64_t n,
               void* out) {
  follow_load();
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(dtype);
  const char* src = static_cast<const char*>(table);
  char* dst = static_cast<char*>(out);
  const size_t total = row_bytes * static_cast<size_t>(n);
#if defined(__SSE2__)
  const bool stream = total >= kStreamMinBytes && row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0;
#else
  const bool stream = false;
#endif
  int64_t bad = INT64_MAX;
  // One pass: copy good rows, zero-fill bad ones and remember the first bad position. Threads
  // take blocks of positions dynamically (a descheduled thread does not stall the others);
  // each block is a sequential output stream.
  const int64_t blocks = (n + kLookupBlock - 1) / kLookupBlock;
#pragma omp parallel reduction(min : bad) if (n * dim > kParallelMin)
  {
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t lo = blk * kLookupBlock, hi = std::min(n, lo + kLookupBlock);
      for (int64_t i = lo; i < std::min(hi, lo + kPrefetchRows); ++i) {
        if (!bad_id(ids[i], rows)) prefetch_row(src + ids[i] * row_bytes, row_bytes);
      }
      for (int64_t i = lo; i < hi; ++i) {
        // Random rows of a large table miss cache and TLB: keep several rows in flight.
        if (i + kPrefetchRows < hi) {
          const int64_t pid = ids[i + kPrefetchRows];
          if (!bad_id(pid, rows)) prefetch_row(src + pid * row_bytes, row_bytes);
        }
        const int64_t id = ids[i];
        if (bad_id(id, rows)) {
          std::memset(dst + i * row_bytes, 0, row_bytes);
          if (i < bad) bad = i;
        } else {
          copy_row(dst + i * row_bytes, src + id * row_bytes, row_bytes, stream);
        }
      }
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence();  // streaming stores are weakly ordered: publish before returning
#endif
  }
  return bad == INT64_MAX ? -1 : bad;
}

namespace {
template <int DT>
inline void axpy_row(float* acc, const void* table, int64_t id, int64_t dim, float w) {
  if constexpr (DT == kF32) {
    const float* r = static_cast<const float*>(table) + id * dim;
    for (int64_t j = 0; j < dim; ++j) acc[j] = acc[j] + w * r[j];
  } else {
    const uint16_t* r = static_cast<const uint16_t*>(table) + id * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float x = DT == kF16 ? f16_to_f32(r[j]) : bf16_to_f32(r[j]);
      acc[j] = acc[j] + w * x;
    }
  }
}

template <int DT>
void pooled_impl(const void* table, int64_t dim, const int64_t* ids, const int64_t* offsets, int64_t bags,
                 const float* weights, int combiner, float* out) {
#pragma omp parallel for schedule(dynamic, 16) if (offsets[bags] * dim > kParallelMin)
  for (int64_t b = 0; b < bags; ++b) {
    float* acc = out + b * dim;
    std::fill(acc, acc + dim, 0.0f);
    float wsum = 0.0f;
    for (int64_t k = offsets[b]; k < offsets[b + 1]; ++k) {
      const float w = weights ? weights[k] : 1.0f;
      wsum = combiner == kSqrtN ? wsum + w * w : wsum + w;
      axpy_row<DT>(acc, table, ids[k], dim, w);
    }
    if (combiner != kSum) {
      const float d = combiner == kSqrtN ? sqrtf(wsum) : wsum;
      if (d != 0.0f) {
        for (int64_t j = 0; j < dim; ++j) acc[j] = acc[j] / d;
      } else {
        std::fill(acc, acc + dim, 0.0f);
      }
    }
  }
}
}  // namespace

int64_t lookup_pooled(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids,
                      int64_t n, const int64_t* offsets, int64_t bags, const float* weights, int combiner,
                      float* out) {
  follow_load();
  const int64_t bad = first_bad_id(ids, n, rows);
  if (bad >= 0) return bad;
  if (dtype == kF32) {
    pooled_impl<kF32>(table, dim, ids, offsets, bags, weights, combiner, out);
  } else if (dtype == kF16) {
    pooled_impl<kF16>(table, dim, ids, offsets, bags, weights, combiner, out);
  } else {
    pooled_impl<kBF16>(table, dim, ids, offsets, bags, weights, combiner, out);
  }
  return -1;
}

namespace {
EDL_MULTIVERSION
void accumulate_chunk(float* __restrict out, const float* const* grads, int num_grads, int64_t lo, int64_t hi,
                      float scale) {
  // Tiles of 1024 elements keep the running sum in L1 while every grad streams once.
  constexpr int64_t kTile = 1024;
  float t[kTile];
  for (int64_t base = lo; base < hi; base += kTile) {
    const int64_t len = std::min(kTile, hi - base);
    const float* g0 = grads[0] + base;
    for (int64_t j = 0; j < len; ++j) t[j] = g0[j];
    for (int k = 1; k < num_grads; ++k) {
      const float* gk = grads[k] + base;
      for (int64_t j = 0; j < len; ++j) t[j] = t[j] + gk[j];
    }
    float* o = out + base;
    if (scale != 1.0f) {
      for (int64_t j = 0; j < len; ++j) o[j] = o[j] + t[j] * scale;
    } else {
      for (int64_t j = 0; j < len; ++j) o[j] = o[j] + t[j];
    }
  }
}

// Elementwise dense kernels (optimizer updates, gradient accumulation) go parallel only above
// this many touched floats (Adam: 1M parameters, ~0.3 ms on one thread). Below it a second
// thread saves at most tens of microseconds, and costs more than that where it matters: after
// every parallel region libgomp's idle team thread spins waiting for the next one, so a PS
// applying a small model (the README CNN: 225k parameters, 8 tensors, one push every ~10 ms)
// kept a core ~25% busy spinning, on a 2-CPU host where the worker's step wanted that core.
constexpr int64_t kElementwiseParallelMin = int64_t{1} << 22;

// Splits [0, n) into one contiguous chunk per thread (aligned to 16 floats).
template <typename F>
void parallel_chunks(int64_t n, int64_t work, F&& f) {
  if (work <= kElementwiseParallelMin || omp_get_max_threads() == 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    int64_t per = (n + nt - 1) / nt;
    per = (per + 15) / 16 * 16;
    const int64_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (lo < hi) f(lo, hi);
  }
}

template <int K>
EDL_MULTIVERSION void dense_chunk(const OptParams& p, float* __restrict param, const float* __restrict grad,
                                  OptSlots s, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) apply_update<K>(p, param, s, i, grad[i]);
}
}  // namespace

void dense_accumulate(float* out, const float* const* grads, int num_grads, int64_t n, float scale) {
  follow_load();
  if (num_grads <= 0) return;
  parallel_chunks(n, n * (num_grads + 1),
                  [&](int64_t lo, int64_t hi) { accumulate_chunk(out, grads, num_grads, lo, hi, scale); });
}

void dense_update(const OptParams& p, float* param, const float* grad, const OptSlots& s, int64_t n) {
  follow_load();
  dispatch_kind(p.kind, [&](auto k) {
    constexpr int K = decltype(k)::value;
    parallel_chunks(n, n * 4, [&](int64_t lo, int64_t hi) { dense_chunk<K>(p, param, grad, s, lo, hi); });
  });
}

// ---------------------------------------------------------------------------------------------
// Aggregation and sparse updates on top of the hash dedup (dedup_cpu.h). Threads take dedup
// partitions dynamically and walk each one's positions in order, so every id's duplicates are
// summed left to right (the order of the NumPy reference) and no two threads touch one row.
namespace {
constexpr int64_t kRowsAhead = 8;
// Positions per dynamically scheduled block of the singleton copy.
constexpr int64_t kSingleBlock = 4096;

inline void prefetch_rows(const float* r, int64_t dim, int rw) {
  for (int64_t b = 0; b < dim; b += 16) {
    if (rw) {
      __builtin_prefetch(r + b, 1, 3);
    } else {
      __builtin_prefetch(r + b, 0, 3);
    }
  }
}

EDL_MULTIVERSION
void aggregate_part(const Dedup& d, int p, const float* grads, int64_t dim, const int64_t* rank, float* out,
                    bool stream, bool skip_singletons) {
  const int64_t kb = d.slot_begin(p), ke = d.slot_begin(p + 1);
  const int64_t* pos = d.positions();
  const int64_t* slot_of = d.slot_of();
  const int64_t* first = d.first_pos();
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
    const float* __restrict src = grads + i * dim;
    float* __restrict dst = out + rank[g] * dim;
    if (first[g] == i) {
      if (stream && count[g] == 1) {
        // A row written once: streaming stores skip reading the destination line first.
        copy_row(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), dim * sizeof(float), true);
      } else {
        for (int64_t j = 0; j < dim; ++j) dst[j] = src[j];
      }
    } else {
      for (int64_t j = 0; j < dim; ++j) dst[j] = dst[j] + src[j];
    }
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
  const int64_t* first = d.first_pos();
  const int64_t* count = d.count();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kRowsAhead < n) {
      const int64_t ia = i + kRowsAhead;
      prefetch_rows(grads + ia * dim, dim, 0);
      if (!stream) prefetch_rows(out + rank[slot_of[ia]] * dim, dim, 1);
    }
    const int64_t g = slot_of[i];
    const float* __restrict src = grads + i * dim;
    float* __restrict dst = out + rank[g] * dim;
    if (first[g] == i) {
      if (stream && count[g] == 1) {
        copy_row(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), dim * sizeof(float), true);
      } else {
        for (int64_t j = 0; j < dim; ++j) dst[j] = src[j];
      }
    } else {
      for (int64_t j = 0; j < dim; ++j) dst[j] = dst[j] + src[j];
    }
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
// A sink says where a finished row goes: `single(i, id, row)` for an id seen once at position
// i, `group(g, id, row)` for group g, and `prefetch(i, id)` for a row about to come.
namespace {
// Grouped positions per dynamically scheduled block of the group sums.
constexpr int64_t kGroupBlock = 2048;
// Positions ahead whose rows the group sums prefetch. Their reads are random; with cold rows
// (Zipf ids) anything from 8 to 64 measured within noise, 96 slower.
constexpr int32_t kGroupRowsAhead = 32;

// Aggregation: row -> out[rank of the id], written once (streaming stores when whole lines).
struct ToOutput {
  const RangeRank& rr;
  float* out;
  int64_t dim;
  bool stream;
  void prefetch(int64_t, int64_t id) const {
    if (!stream) prefetch_rows(out + rr.rank(id) * dim, dim, 1);
  }
  void single(int64_t, int64_t id, const float* row) const { put(rr.rank(id), row); }
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
  void prefetch(int64_t, int64_t id) const { prefetch_update_rows(table, s, id * dim, dim); }
  void single(int64_t, int64_t id, const float* row) const { apply_row<K>(p, table, s, id * dim, row, dim); }
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
      sink.prefetch(i + kRowsAhead, ids[i + kRowsAhead]);
    }
    const int64_t id = ids[i];
    if (!rr.repeated(id)) {
      sink.single(i, id, grads + i * dim);
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

// Whole 64-byte destination lines, aligned: rows can be written with streaming stores.
bool stream_rows(const float* out, int64_t dim, int64_t rows) {
#if defined(__SSE2__)
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  return row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0 &&
         row_bytes * static_cast<size_t>(rows) >= kStreamMinBytes;
#else
  (void)out, (void)dim, (void)rows;
  return false;
#endif
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
  if (P == 1 || omp_get_max_threads() == 1) {
    // One thread: one sequential sweep of all positions (the hardware prefetcher follows it;
    // measured 2x faster than walking the partitions one by one for Zipf ids).
    aggregate_sweep(d, grads, dim, rank, out, stream);
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
    return;
  }
  // Several threads: partitions taken dynamically. (Each thread sweeping all positions for
  // the partitions it owns was slower with 2 threads: the rows are interleaved row by row
  // and each core's prefetcher also fetched the other's.)
  // Mostly distinct ids (at least half the positions unique): the rows of ids seen once need
  // no order, so they are copied in contiguous blocks of positions (sequential reads, 3.0 ->
  // 2.4 ms for 100k uniform ids) and only repeated ids go by partition. Skewed batches (few
  // singletons) skip the extra sweep.
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
  const int64_t bad = first_bad_id(ids, n, rows);
  if (bad >= 0) return bad;
  if (auto rr = RangeRank::build(ids, n)) {  // ids are rows: a narrow range unless the table is sparse
    dispatch_kind(p.kind, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      ranked_rows(*rr, grads, dim, nullptr, ToTable<K>{p, table, s, dim});
    });
    return -1;
  }
  Dedup d(ids, n);
  float* buf = d.float_buffer(n * dim);  // rows used only by repeated ids (pages touched lazily)
  const int P = d.parts();
  dispatch_kind(p.kind, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
#pragma omp parallel for schedule(dynamic, 1) if (P > 1)
    for (int q = 0; q < P; ++q) sparse_part<K>(p, table, dim, ids, grads, s, d, q, buf);
  });
  return -1;
}

}  // namespace cpu
}  // namespace edl
