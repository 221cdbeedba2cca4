// CUDA kernels behind the same entry points as kernels_cpu.cc. Arrays are device
// pointers (from __cuda_array_interface__); work runs on the legacy default stream
// (the one PyTorch and CuPy use unless told otherwise) of the device that owns the
// first array. Row kernels give each row `tpr` threads moving 16-byte vectors where
// alignment allows. Aggregation sorts (id, position) pairs with CUB (stable), then sums
// each id's rows in chunks of kSumChunk positions, one warp per chunk, and the chunk sums
// in order: deterministic run to run, and the CPU's left-to-right sum exactly for ids seen
// at most kSumChunk times (a hot id's thousands of rows are not one warp's serial loop).
// Sparse optimizer updates are fused with the sum: aggregated gradients of ids with one
// chunk never touch device memory.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <climits>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels.h"
#include "update_rules.h"

namespace edl {
namespace cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string("elasticdl_native CUDA error in ") + what + ": " +
                             cudaGetErrorString(e));
  }
}
#define EDL_CUDA(x) check((x), #x)

constexpr int kBlock = 256;
// Positions of one id summed by one warp before the partial sums are combined (kernels.h).
constexpr int64_t kSumChunk = kCudaSumChunk;

// Switches to the device that owns `ptr` for the scope of one call.
class DeviceGuard {
 public:
  explicit DeviceGuard(const void* ptr) {
    EDL_CUDA(cudaGetDevice(&prev_));
    cudaPointerAttributes attr{};
    if (ptr && cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeDevice) {
      dev_ = attr.device;
    } else {
      cudaGetLastError();
      dev_ = prev_;
    }
    if (dev_ != prev_) EDL_CUDA(cudaSetDevice(dev_));
  }
  ~DeviceGuard() {
    if (dev_ != prev_) cudaSetDevice(prev_);
  }
  int device() const { return dev_; }

 private:
  int prev_ = 0, dev_ = 0;
};

// Grow-only scratch memory per device (sort buffers, flags); guarded by one mutex, so
// concurrent calls from several Python threads serialise on it.
struct Workspace {
  std::mutex mu;
  std::vector<void*> buf;
  std::vector<size_t> cap;
  void* get(int dev, size_t bytes) {
    if (static_cast<int>(buf.size()) <= dev) {
      buf.resize(dev + 1, nullptr);
      cap.resize(dev + 1, 0);
    }
    if (cap[dev] < bytes) {
      if (buf[dev]) EDL_CUDA(cudaFree(buf[dev]));
      buf[dev] = nullptr;
      const size_t want = bytes + bytes / 4;
      EDL_CUDA(cudaMalloc(&buf[dev], want));
      cap[dev] = want;
    }
    return buf[dev];
  }
};
Workspace& workspace() {
  static Workspace* w = new Workspace();  // never freed: outlives CUDA teardown at exit
  return *w;
}

inline size_t align_up(size_t x) { return (x + 255) / 256 * 256; }

int blocks_for(int64_t work_items, int per_block) {
  int64_t b = (work_items + per_block - 1) / per_block;
  if (b < 1) b = 1;
  return static_cast<int>(b > 65535 * 32 ? 65535 * 32 : b);
}

// Threads per row: the smallest power of two covering the row's vectors, at most a warp.
int threads_per_row(int64_t vecs) {
  int t = 1;
  while (t < 32 && t < vecs) t <<= 1;
  return t;
}

__global__ void find_bad_ids(const int64_t* ids, int64_t n, int64_t rows, unsigned long long* bad) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t id = ids[i];
    if (id < 0 || id >= rows) atomicMin(bad, static_cast<unsigned long long>(i));
  }
}

int64_t read_bad(const unsigned long long* d_bad) {
  unsigned long long h = ULLONG_MAX;
  EDL_CUDA(cudaMemcpy(&h, d_bad, sizeof(h), cudaMemcpyDeviceToHost));
  return h == ULLONG_MAX ? -1 : static_cast<int64_t>(h);
}

// ------------------------------------------------------------------------------- lookup
template <typename V>
__global__ void gather_rows(const V* __restrict__ table, int64_t rows, int64_t row_vecs, const int64_t* __restrict__ ids,
                            int64_t n, V* __restrict__ out, int tpr, unsigned long long* bad) {
  const int lane = threadIdx.x % tpr;
  const int64_t rows_per_grid = (int64_t)gridDim.x * (blockDim.x / tpr);
  for (int64_t i = blockIdx.x * (int64_t)(blockDim.x / tpr) + threadIdx.x / tpr; i < n; i += rows_per_grid) {
    const int64_t id = __ldg(ids + i);
    V* dst = out + i * row_vecs;
    if (id < 0 || id >= rows) {
      if (lane == 0) atomicMin(bad, static_cast<unsigned long long>(i));
      for (int64_t j = lane; j < row_vecs; j += tpr) dst[j] = V{};
      continue;
    }
    const V* src = table + id * row_vecs;
    for (int64_t j = lane; j < row_vecs; j += tpr) dst[j] = __ldg(src + j);
  }
}

template <typename V>
void launch_gather(const void* table, int64_t rows, int64_t row_bytes, const int64_t* ids, int64_t n, void* out,
                   unsigned long long* bad) {
  const int64_t vecs = row_bytes / sizeof(V);
  const int tpr = threads_per_row(vecs);
  gather_rows<V><<<blocks_for(n, kBlock / tpr), kBlock>>>(static_cast<const V*>(table), rows, vecs, ids, n,
                                                           static_cast<V*>(out), tpr, bad);
}

// ------------------------------------------------------------------------------ pooling
template <int DT>
__global__ void pool_bags(const void* __restrict__ table, int64_t dim, const int64_t* __restrict__ ids,
                          const int64_t* __restrict__ offsets, int64_t bags, const float* __restrict__ weights,
                          int combiner, float* __restrict__ out) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t b = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; b < bags; b += warps) {
    const int64_t lo = offsets[b], hi = offsets[b + 1];
    float wsum = 0.f;
    for (int64_t k = lo; k < hi; ++k) {
      const float w = weights ? weights[k] : 1.f;
      wsum = combiner == kSqrtN ? wsum + w * w : wsum + w;
    }
    const float d = combiner == kSum ? 1.f : (combiner == kSqrtN ? sqrtf(wsum) : wsum);
    for (int64_t j = lane; j < dim; j += 32) {
      float acc = 0.f;
      for (int64_t k = lo; k < hi; ++k) {
        const float w = weights ? weights[k] : 1.f;
        acc = acc + w * load_as_f32(table, DT, ids[k] * dim + j);
      }
      if (combiner != kSum) acc = d != 0.f ? acc / d : 0.f;
      out[b * dim + j] = acc;
    }
  }
}

// ------------------------------------------------------------------------- aggregation
// After sorting: head flags -> inclusive scan gives each sorted position its segment number.
__global__ void mark_heads(const int64_t* keys, int64_t n, int64_t* head) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    head[i] = (i == 0 || keys[i] != keys[i - 1]) ? 1 : 0;
}

__global__ void segment_starts(const int64_t* keys, const int64_t* seg, int64_t n, int64_t* start, int64_t* uniq,
                               int64_t* num_unique) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i == 0 || keys[i] != keys[i - 1]) {
      start[seg[i] - 1] = i;
      if (uniq) uniq[seg[i] - 1] = keys[i];
    }
    if (i == n - 1) {
      start[seg[i]] = n;
      *num_unique = seg[i];
    }
  }
}

// Chunks: runs of at most kSumChunk consecutive sorted positions of one segment. A position
// starts a chunk when it starts its segment or lies a multiple of kSumChunk past its start.
__global__ void mark_chunk_heads(const int64_t* seg, const int64_t* start, int64_t n, int64_t* head) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    head[i] = (i - start[seg[i] - 1]) % kSumChunk == 0 ? 1 : 0;
}

// From the inclusive scan `chunk` of the chunk heads: each chunk's first sorted position,
// each segment's first chunk (seg_chunk[u] = number of chunks).
__global__ void chunk_starts(const int64_t* chunk, const int64_t* seg, int64_t n, int64_t* chunk_start,
                             int64_t* seg_chunk) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i == 0 || chunk[i] != chunk[i - 1]) chunk_start[chunk[i] - 1] = i;
    if (i == 0 || seg[i] != seg[i - 1]) seg_chunk[seg[i] - 1] = chunk[i] - 1;
    if (i == n - 1) {
      chunk_start[chunk[i]] = n;
      seg_chunk[seg[i]] = chunk[i];
    }
  }
}

// The final sum of segment k, element j: stored (aggregate) or applied to table row uniq[k]
// with optimizer K (fused sparse update).
template <int K, bool kApply>
__device__ __forceinline__ void finish(int64_t k, int64_t j, float acc, int64_t dim, const int64_t* uniq,
                                       float* out, const OptParams& p, float* table, const OptSlots& s) {
  if constexpr (kApply) {
    apply_update<K>(p, table, s, uniq[k] * dim + j, acc);
  } else {
    out[k * dim + j] = acc;
  }
}

// One warp per chunk: its rows summed in sorted (= original) order. A segment of one chunk
// is finished here; otherwise the chunk's sum goes to partial[c].
template <int K, bool kApply>
__global__ void sum_chunks(const int64_t* __restrict__ chunk_start, const int64_t* __restrict__ seg,
                           const int64_t* __restrict__ seg_chunk, const int64_t* __restrict__ order,
                           const int64_t* __restrict__ uniq, const int64_t* __restrict__ num_unique,
                           const float* __restrict__ grads, int64_t dim, float* __restrict__ partial,
                           float* __restrict__ out, OptParams p, float* table, OptSlots s,
                           const unsigned long long* bad) {
  if (kApply && *bad != ULLONG_MAX) return;  // some id was out of range: update nothing
  const int64_t chunks = seg_chunk[*num_unique];
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t c = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; c < chunks; c += warps) {
    const int64_t lo = chunk_start[c], hi = chunk_start[c + 1];
    const int64_t k = seg[lo] - 1;
    const bool whole = seg_chunk[k + 1] - seg_chunk[k] == 1;
    for (int64_t j = lane; j < dim; j += 32) {
      float acc = grads[order[lo] * dim + j];
      for (int64_t r = lo + 1; r < hi; ++r) acc = acc + grads[order[r] * dim + j];
      if (whole) {
        finish<K, kApply>(k, j, acc, dim, uniq, out, p, table, s);
      } else {
        partial[c * dim + j] = acc;
      }
    }
  }
}

// One warp per segment of several chunks: the chunk sums added in order, then finished.
template <int K, bool kApply>
__global__ void sum_partials(const int64_t* __restrict__ seg_chunk, const int64_t* __restrict__ uniq,
                             const int64_t* __restrict__ num_unique, const float* __restrict__ partial, int64_t dim,
                             float* __restrict__ out, OptParams p, float* table, OptSlots s,
                             const unsigned long long* bad) {
  if (kApply && *bad != ULLONG_MAX) return;
  const int64_t u = *num_unique;
  const int lane = threadIdx.x % 32;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
  for (int64_t k = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; k < u; k += warps) {
    const int64_t c0 = seg_chunk[k], c1 = seg_chunk[k + 1];
    if (c1 - c0 == 1) continue;
    for (int64_t j = lane; j < dim; j += 32) {
      float acc = partial[c0 * dim + j];
      for (int64_t c = c0 + 1; c < c1; ++c) acc = acc + partial[c * dim + j];
      finish<K, kApply>(k, j, acc, dim, uniq, out, p, table, s);
    }
  }
}

__global__ void iota(int64_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) v[i] = i;
}

// Device buffers of one sort + segmentation + chunking, carved from the workspace.
struct Plan {
  unsigned long long* bad;
  int64_t *num_unique, *keys, *order, *seg, *start, *uniq, *chunk, *chunk_start, *seg_chunk;
  float* partial;  // a row per chunk (only chunks of multi-chunk segments are written)
};

// Sorts ids (only `bits` low bits when ids are known to be in [0, 2^bits)), segments them
// and cuts the segments into chunks. uniq_out: where unique ids go (nullptr -> plan.uniq).
Plan build_plan(int dev, const int64_t* ids, int64_t n, int bits, int64_t rows_for_check, int64_t* uniq_out,
                int64_t dim) {
  size_t sort_bytes = 0, scan_bytes = 0;
  EDL_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (const int64_t*)nullptr, (int64_t*)nullptr,
                                           (const int64_t*)nullptr, (int64_t*)nullptr, n, 0, bits));
  EDL_CUDA(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, (const int64_t*)nullptr, (int64_t*)nullptr, n));
  const size_t tmp_bytes = align_up(sort_bytes > scan_bytes ? sort_bytes : scan_bytes);
  const size_t vec = align_up(sizeof(int64_t) * (n + 1));
  // Chunks: at most one per segment plus one per kSumChunk positions.
  const size_t partial_bytes = align_up(sizeof(float) * static_cast<size_t>(dim) * (n + n / kSumChunk + 1));
  const size_t total = 256 + 8 * vec + partial_bytes + tmp_bytes;
  char* w = static_cast<char*>(workspace().get(dev, total));
  Plan p;
  p.bad = reinterpret_cast<unsigned long long*>(w);
  p.num_unique = reinterpret_cast<int64_t*>(w + 64);
  char* c = w + 256;
  int64_t** vecs[] = {&p.keys, &p.order, &p.seg, &p.start, &p.uniq, &p.chunk, &p.chunk_start, &p.seg_chunk};
  for (int64_t** v : vecs) {
    *v = reinterpret_cast<int64_t*>(c);
    c += vec;
  }
  p.partial = reinterpret_cast<float*>(c);
  c += partial_bytes;
  void* tmp = c;
  EDL_CUDA(cudaMemsetAsync(p.bad, 0xff, sizeof(unsigned long long)));
  EDL_CUDA(cudaMemsetAsync(p.num_unique, 0, sizeof(int64_t)));
  EDL_CUDA(cudaMemsetAsync(p.seg_chunk, 0, sizeof(int64_t)));  // n == 0: no chunks
  if (n == 0) return p;
  if (rows_for_check >= 0) find_bad_ids<<<blocks_for(n, kBlock), kBlock>>>(ids, n, rows_for_check, p.bad);
  iota<<<blocks_for(n, kBlock), kBlock>>>(p.chunk, n);  // sort values: positions (chunk is free until step 4)
  EDL_CUDA(cub::DeviceRadixSort::SortPairs(tmp, sort_bytes, ids, p.keys, p.chunk, p.order, n, 0, bits));
  mark_heads<<<blocks_for(n, kBlock), kBlock>>>(p.keys, n, p.seg);
  EDL_CUDA(cub::DeviceScan::InclusiveSum(tmp, scan_bytes, p.seg, p.seg, n));
  segment_starts<<<blocks_for(n, kBlock), kBlock>>>(p.keys, p.seg, n, p.start, uniq_out ? uniq_out : p.uniq,
                                                     p.num_unique);
  mark_chunk_heads<<<blocks_for(n, kBlock), kBlock>>>(p.seg, p.start, n, p.chunk);
  EDL_CUDA(cub::DeviceScan::InclusiveSum(tmp, scan_bytes, p.chunk, p.chunk, n));
  chunk_starts<<<blocks_for(n, kBlock), kBlock>>>(p.chunk, p.seg, n, p.chunk_start, p.seg_chunk);
  if (uniq_out) p.uniq = uniq_out;
  return p;
}

// Sums the chunks, then the chunk sums of long segments (grid sized for the worst case: the
// counts live on the device).
template <int K, bool kApply>
void reduce_plan(const Plan& p, int64_t n, const float* grads, int64_t dim, float* out, const OptParams& op,
                 float* table, const OptSlots& s) {
  const int grid = blocks_for(n, kBlock / 32);
  sum_chunks<K, kApply><<<grid, kBlock>>>(p.chunk_start, p.seg, p.seg_chunk, p.order, p.uniq, p.num_unique, grads,
                                          dim, p.partial, out, op, table, s, p.bad);
  sum_partials<K, kApply><<<grid, kBlock>>>(p.seg_chunk, p.uniq, p.num_unique, p.partial, dim, out, op, table, s,
                                            p.bad);
  EDL_CUDA(cudaGetLastError());
}

int bits_for_rows(int64_t rows) {
  int b = 1;
  while (b < 63 && (int64_t{1} << b) < rows) ++b;
  return b;
}

struct MaxU64 {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const { return a > b ? a : b; }
};

// The largest id read as unsigned: a negative id reads as >= 2^63.
__global__ void max_as_unsigned(const int64_t* __restrict__ ids, int64_t n, unsigned long long* out) {
  using Reduce = cub::BlockReduce<unsigned long long, kBlock>;
  __shared__ typename Reduce::TempStorage tmp;
  unsigned long long m = 0;
  for (int64_t i = blockIdx.x * int64_t{kBlock} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kBlock)
    m = m > static_cast<unsigned long long>(ids[i]) ? m : static_cast<unsigned long long>(ids[i]);
  m = Reduce(tmp).Reduce(m, MaxU64());
  if (threadIdx.x == 0) atomicMax(out, m);
}

// The key bits a sort of ids must look at: a radix sort's passes grow with the bits, and ids
// of a table of R rows need only log2(R) of 64. Negative ids need all 64 (signed order).
// One small reduction and a read back cost less than the passes they save from 10^4 ids up.
int sort_bits_of(int dev, const int64_t* ids, int64_t n) {
  if (n == 0) return 64;
  auto* m = reinterpret_cast<unsigned long long*>(static_cast<char*>(workspace().get(dev, 256)) + 128);
  EDL_CUDA(cudaMemsetAsync(m, 0, sizeof(*m)));
  max_as_unsigned<<<blocks_for(n, kBlock) < 1024 ? blocks_for(n, kBlock) : 1024, kBlock>>>(ids, n, m);
  unsigned long long top = 0;
  EDL_CUDA(cudaMemcpy(&top, m, sizeof(top), cudaMemcpyDeviceToHost));
  return top >= (1ull << 62) ? 64 : bits_for_rows(static_cast<int64_t>(top) + 1);
}

}  // namespace

std::vector<int> compiled_archs() {
#ifdef __CUDA_ARCH_LIST__
  return {__CUDA_ARCH_LIST__};
#else
  return {};
#endif
}

int runtime_version() { return CUDART_VERSION; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver / no device: report none instead of failing
    return 0;
  }
  return n;
}

int64_t lookup(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids, int64_t n, void* out) {
  DeviceGuard g(table);
  std::lock_guard<std::mutex> lock(workspace().mu);
  auto* bad = static_cast<unsigned long long*>(workspace().get(g.device(), 256));
  EDL_CUDA(cudaMemsetAsync(bad, 0xff, sizeof(*bad)));
  if (n > 0) {
    const int64_t row_bytes = dim * dtype_size(dtype);
    const uintptr_t a = reinterpret_cast<uintptr_t>(table) | reinterpret_cast<uintptr_t>(out) | row_bytes;
    if (a % 16 == 0) launch_gather<int4>(table, rows, row_bytes, ids, n, out, bad);
    else if (a % 8 == 0) launch_gather<int2>(table, rows, row_bytes, ids, n, out, bad);
    else if (a % 4 == 0) launch_gather<int>(table, rows, row_bytes, ids, n, out, bad);
    else launch_gather<short>(table, rows, row_bytes, ids, n, out, bad);
    EDL_CUDA(cudaGetLastError());
  }
  return read_bad(bad);
}

int64_t lookup_pooled(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids, int64_t n,
                      const int64_t* offsets, int64_t bags, const float* weights, int combiner, float* out) {
  DeviceGuard g(table);
  std::lock_guard<std::mutex> lock(workspace().mu);
  auto* bad = static_cast<unsigned long long*>(workspace().get(g.device(), 256));
  EDL_CUDA(cudaMemsetAsync(bad, 0xff, sizeof(*bad)));
  if (n > 0) find_bad_ids<<<blocks_for(n, kBlock), kBlock>>>(ids, n, rows, bad);
  const int64_t b = read_bad(bad);  // must not read rows of bad ids
  if (b >= 0 || bags == 0) return b;
  const int grid = blocks_for(bags, kBlock / 32);
  if (dtype == kF32) pool_bags<kF32><<<grid, kBlock>>>(table, dim, ids, offsets, bags, weights, combiner, out);
  else if (dtype == kF16) pool_bags<kF16><<<grid, kBlock>>>(table, dim, ids, offsets, bags, weights, combiner, out);
  else pool_bags<kBF16><<<grid, kBlock>>>(table, dim, ids, offsets, bags, weights, combiner, out);
  EDL_CUDA(cudaGetLastError());
  return -1;
}

int64_t aggregate(const int64_t* ids, int64_t n, const float* grads, int64_t dim, int64_t* out_ids, float* out) {
  DeviceGuard g(grads);
  std::lock_guard<std::mutex> lock(workspace().mu);
  Plan p = build_plan(g.device(), ids, n, sort_bits_of(g.device(), ids, n), -1, out_ids, dim);
  if (n > 0) reduce_plan<kSGD, false>(p, n, grads, dim, out, OptParams{}, nullptr, OptSlots{});
  int64_t u = 0;
  EDL_CUDA(cudaMemcpy(&u, p.num_unique, sizeof(u), cudaMemcpyDeviceToHost));
  return u;
}

int64_t sparse_update(const OptParams& op, float* table, int64_t rows, int64_t dim, const int64_t* ids, int64_t n,
                      const float* grads, const OptSlots& s) {
  DeviceGuard g(table);
  std::lock_guard<std::mutex> lock(workspace().mu);
  Plan p = build_plan(g.device(), ids, n, bits_for_rows(rows), rows, nullptr, dim);
  if (n > 0) {
    // Out-of-range ids may have been sorted with too few bits; the kernels then do nothing.
    dispatch_kind(op.kind, [&](auto kc) {
      constexpr int K = decltype(kc)::value;
      reduce_plan<K, true>(p, n, grads, dim, nullptr, op, table, s);
    });
  }
  return read_bad(p.bad);
}

// --------------------------------------------------------------------------- dense ops
namespace {
constexpr int kMaxGrads = 8;
struct GradPtrs {
  const float* g[kMaxGrads];
  int count;
};

__global__ void accumulate_kernel(float* __restrict__ out, GradPtrs gp, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    float t = gp.g[0][i];
    for (int k = 1; k < gp.count; ++k) t = t + gp.g[k][i];
    out[i] = scale != 1.f ? out[i] + t * scale : out[i] + t;
  }
}

template <int K>
__global__ void dense_kernel(OptParams p, float* __restrict__ param, const float* __restrict__ grad, OptSlots s,
                             int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    apply_update<K>(p, param, s, i, grad[i]);
}

int elementwise_grid(int64_t n) {
  // Enough blocks to fill the GPU several times over; grid-stride loops cover the rest.
  return blocks_for(n, kBlock * 4);
}
}  // namespace

void dense_accumulate(float* out, const float* const* grads, int num_grads, int64_t n, float scale) {
  DeviceGuard g(out);
  // More than kMaxGrads gradients are summed in groups (each group scaled, then added).
  for (int base = 0; base < num_grads && n > 0; base += kMaxGrads) {
    GradPtrs gp{};
    gp.count = num_grads - base < kMaxGrads ? num_grads - base : kMaxGrads;
    for (int k = 0; k < gp.count; ++k) gp.g[k] = grads[base + k];
    accumulate_kernel<<<elementwise_grid(n), kBlock>>>(out, gp, n, scale);
    EDL_CUDA(cudaGetLastError());
  }
}

void dense_update(const OptParams& p, float* param, const float* grad, const OptSlots& s, int64_t n) {
  if (n == 0) return;
  DeviceGuard g(param);
  dispatch_kind(p.kind, [&](auto kc) {
    constexpr int K = decltype(kc)::value;
    dense_kernel<K><<<elementwise_grid(n), kBlock>>>(p, param, grad, s, n);
  });
  EDL_CUDA(cudaGetLastError());
}

}  // namespace cuda
}  // namespace edl
