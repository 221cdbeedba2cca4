// CPU kernels -- thread sizing, embedding lookups, dense accumulation and dense optimizer steps
// (aggregation and sparse updates: sparse_cpu.cc). OpenMP across rows/elements; inner loops are
// plain contiguous loops that GCC vectorises. Hot element-wise loops are cloned for AVX2 and
// picked at load time (function multiversioning), so the wheel still runs on any x86-64.
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
#include "kernels.h"
#include "rows_cpu.h"
#include "update_rules.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace edl {
namespace cpu {
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
  // slice, longer than the kernel itself. libgomp's own dynamic mode is no substitute: it
  // subtracts the 15-MINUTE load average, rounded up, so on a small host it keeps one thread
  // long after a burst and at a steady load that leaves a CPU idle (measurements:
  // benchmarks/ops/RESULTS.md, "Notes moved out of the sources").
  // nthreads-var is per calling thread, hence set on every entry (a thread-local store).
  static const bool user_set = std::getenv("OMP_DYNAMIC") != nullptr;
  if (user_set) return;
  omp_set_dynamic(0);
  omp_set_num_threads(team_for_load());
}

int team_threads() {
  follow_load();
  return omp_get_max_threads();
}

namespace {
// Rows per thread that the gather prefetches ahead. Each 256-byte row is 4 cache lines, so
// ~kPrefetchRows*4 misses are in flight per core: enough to cover DRAM latency on random rows.
constexpr int64_t kPrefetchRows = 8;
// Positions per dynamically scheduled block of the gather.
constexpr int64_t kLookupBlock = 4096;

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
// this many touched floats (Adam: 1M parameters). Below it a second thread saves little, and
// costs more than that where it matters: after every parallel region libgomp's idle team
// thread spins waiting for the next one, so a PS applying a small model push after push keeps
// a core busy spinning, a core the worker's step on the same host wants (RESULTS.md, "Notes
// moved out of the sources").
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

}  // namespace cpu
}  // namespace edl
