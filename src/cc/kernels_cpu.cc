// CPU kernels: OpenMP across rows/elements; inner loops are plain contiguous loops
// that GCC vectorises. Hot element-wise loops are cloned for AVX2 and picked at load
// time (function multiversioning), so the wheel still runs on any x86-64.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels.h"
#include "update_rules.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EDL_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define EDL_MULTIVERSION
#endif

namespace edl {
namespace cpu {
namespace {

// Below this many touched elements a kernel runs on one thread: the fork/join costs more.
constexpr int64_t kParallelMin = 1 << 15;
// How many rows ahead the gather loops prefetch.
constexpr int64_t kPrefetch = 12;

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

int num_threads() { return omp_get_max_threads(); }

int64_t lookup(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids, int64_t n,
               void* out) {
  const size_t row_bytes = static_cast<size_t>(dim) * dtype_size(dtype);
  const char* src = static_cast<const char*>(table);
  char* dst = static_cast<char*>(out);
  int64_t bad = INT64_MAX;
  // One pass: copy good rows, zero-fill bad ones and remember the first bad position.
#pragma omp parallel for reduction(min : bad) schedule(static) if (n * dim > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    // Random rows of a large table miss cache and TLB: prefetch a few rows ahead so
    // several misses are in flight per thread.
    if (i + kPrefetch < n) {
      const int64_t pid = ids[i + kPrefetch];
      if (!bad_id(pid, rows)) {
        const char* pr = src + pid * row_bytes;
        for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(pr + b, 0, 0);
      }
    }
    const int64_t id = ids[i];
    if (bad_id(id, rows)) {
      std::memset(dst + i * row_bytes, 0, row_bytes);
      if (i < bad) bad = i;
    } else {
      std::memcpy(dst + i * row_bytes, src + id * row_bytes, row_bytes);
    }
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

// Splits [0, n) into one contiguous chunk per thread (aligned to 16 floats).
template <typename F>
void parallel_chunks(int64_t n, int64_t work, F&& f) {
  if (work <= kParallelMin || omp_get_max_threads() == 1) {
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
  if (num_grads <= 0) return;
  parallel_chunks(n, n * (num_grads + 1),
                  [&](int64_t lo, int64_t hi) { accumulate_chunk(out, grads, num_grads, lo, hi, scale); });
}

void dense_update(const OptParams& p, float* param, const float* grad, const OptSlots& s, int64_t n) {
  dispatch_kind(p.kind, [&](auto k) {
    constexpr int K = decltype(k)::value;
    parallel_chunks(n, n * 4, [&](int64_t lo, int64_t hi) { dense_chunk<K>(p, param, grad, s, lo, hi); });
  });
}

// ---------------------------------------------------------------------------------------------
// Aggregation plan: a stable LSD radix sort of (id, position) on the id's significant bits
// (ids are biased by their minimum, so a 1M-row table needs two 11-bit passes), then run
// boundaries. Stable order means duplicates are later summed in their original order.
AggPlan::~AggPlan() {
  delete[] uniq;
  delete[] start;
  delete[] order;
}

void build_plan(const int64_t* ids, int64_t n, AggPlan* plan) {
  plan->order = new int64_t[std::max<int64_t>(n, 1)];
  if (n == 0) {
    plan->uniq = new int64_t[1];
    plan->start = new int64_t[1]{0};
    plan->num_unique = 0;
    return;
  }
  int64_t lo = ids[0], hi = ids[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, ids[i]);
    hi = std::max(hi, ids[i]);
  }
  const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  int bits = 0;
  while (bits < 64 && (span >> bits) != 0) ++bits;

  std::unique_ptr<uint64_t[]> key(new uint64_t[n]), key2(new uint64_t[n]);
  std::unique_ptr<int64_t[]> pos2(new int64_t[n]);
  int64_t* pos = plan->order;
  for (int64_t i = 0; i < n; ++i) {
    key[i] = static_cast<uint64_t>(ids[i]) - static_cast<uint64_t>(lo);
    pos[i] = i;
  }
  if (n < 256) {  // tiny batches: insertion-free std::stable_sort is cheaper than radix passes
    std::stable_sort(pos, pos + n, [&](int64_t a, int64_t b) { return key[a] < key[b]; });
    for (int64_t i = 0; i < n; ++i) key2[i] = key[pos[i]];
    std::copy(key2.get(), key2.get() + n, key.get());
  } else {
    constexpr int kRadix = 11, kBuckets = 1 << kRadix;
    std::vector<int64_t> count(kBuckets);
    uint64_t *kin = key.get(), *kout = key2.get();
    int64_t *pin = pos, *pout = pos2.get();
    for (int shift = 0; shift < bits; shift += kRadix) {
      std::fill(count.begin(), count.end(), 0);
      for (int64_t i = 0; i < n; ++i) ++count[(kin[i] >> shift) & (kBuckets - 1)];
      int64_t sum = 0;
      for (auto& c : count) {
        const int64_t c0 = c;
        c = sum;
        sum += c0;
      }
      for (int64_t i = 0; i < n; ++i) {
        const int64_t d = count[(kin[i] >> shift) & (kBuckets - 1)]++;
        kout[d] = kin[i];
        pout[d] = pin[i];
      }
      std::swap(kin, kout);
      std::swap(pin, pout);
    }
    if (pin != pos) std::copy(pin, pin + n, pos);
    if (kin != key.get()) std::copy(kin, kin + n, key.get());
  }
  // Run boundaries.
  int64_t u = 1;
  for (int64_t i = 1; i < n; ++i) u += key[i] != key[i - 1];
  plan->num_unique = u;
  plan->uniq = new int64_t[u];
  plan->start = new int64_t[u + 1];
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || key[i] != key[i - 1]) {
      plan->uniq[k] = static_cast<int64_t>(key[i] + static_cast<uint64_t>(lo));
      plan->start[k++] = i;
    }
  }
  plan->start[u] = n;
}

namespace {
// Sums the rows of segment k of the plan into dst (first row copied, the rest added in order).
inline void sum_segment(const AggPlan& plan, const float* grads, int64_t dim, int64_t k, float* __restrict dst) {
  const int64_t b = plan.start[k], e = plan.start[k + 1];
  const float* g0 = grads + plan.order[b] * dim;
  for (int64_t j = 0; j < dim; ++j) dst[j] = g0[j];
  for (int64_t r = b + 1; r < e; ++r) {
    if (r + 4 < e) __builtin_prefetch(grads + plan.order[r + 4] * dim, 0, 0);
    const float* g = grads + plan.order[r] * dim;
    for (int64_t j = 0; j < dim; ++j) dst[j] = dst[j] + g[j];
  }
}
}  // namespace

void aggregate_rows(const AggPlan& plan, const float* grads, int64_t dim, int64_t* out_ids, float* out) {
  const int64_t u = plan.num_unique;
  std::copy(plan.uniq, plan.uniq + u, out_ids);
#pragma omp parallel for schedule(dynamic, 64) if (plan.start[u] * dim > kParallelMin)
  for (int64_t k = 0; k < u; ++k) sum_segment(plan, grads, dim, k, out + k * dim);
}

int64_t sparse_update(const OptParams& p, float* table, int64_t rows, int64_t dim, const int64_t* ids,
                      int64_t n, const float* grads, const OptSlots& s) {
  const int64_t bad = first_bad_id(ids, n, rows);
  if (bad >= 0) return bad;
  AggPlan plan;
  build_plan(ids, n, &plan);
  const int64_t u = plan.num_unique;
  // Fused: each unique row's gradient is summed in a per-thread buffer and applied at once,
  // so the aggregated gradient never goes to memory. Rows are distinct: no races.
  dispatch_kind(p.kind, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
#pragma omp parallel if (n * dim > kParallelMin)
    {
      std::vector<float> buf(dim);
#pragma omp for schedule(dynamic, 64)
      for (int64_t k = 0; k < u; ++k) {
        sum_segment(plan, grads, dim, k, buf.data());
        const int64_t base = plan.uniq[k] * dim;
        for (int64_t j = 0; j < dim; ++j) apply_update<K>(p, table, s, base + j, buf[j]);
      }
    }
  });
  return -1;
}

}  // namespace cpu
}  // namespace edl
