// Memory-bound kernels of the ElasticDL parameter server (CPU: kernels_cpu.cc for lookups and
// dense ops, sparse_cpu.cc for aggregation and sparse updates; CUDA: kernels_cuda.cu). All
// arrays are dense and C-contiguous; the Python layer (elasticdl/ops) checks dtypes, shapes and
// layout before calling. Kernels that read rows by id check every id themselves and return the
// position of the first id outside [0, rows) (or -1): such a call writes nothing to tables or
// slots.
#pragma once

#include <cstdint>
#include <vector>

namespace edl {

enum DType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
enum Combiner : int { kSum = 0, kMean = 1, kSqrtN = 2 };
enum OptKind : int { kSGD = 0, kMomentum = 1, kAdam = 2, kAdagrad = 3 };

// Scalars of one optimizer step, for dense and sparse updates alike.
struct OptParams {
  int kind = kSGD;
  float lr = 0.f;       // SGD/Momentum/Adagrad lr; Adam: bias-corrected lr_t
  float mu = 0.f;       // Momentum
  bool nesterov = false;
  float beta1 = 0.f, beta2 = 0.f, eps = 0.f;  // Adam (eps also Adagrad)
  bool amsgrad = false;
};

// Slot arrays of one optimizer (nullptr when unused), shaped like the parameter.
struct OptSlots {
  float* s0 = nullptr;  // velocity | m | accumulator
  float* s1 = nullptr;  // v
  float* s2 = nullptr;  // max_v (AMSGrad)
};

namespace cpu {
int num_threads();
// Sizes the calling thread's OpenMP teams by the free CPUs (1-minute load average) unless
// OMP_DYNAMIC is set; num_threads() is the maximum (OMP_NUM_THREADS or the CPUs).
void follow_load();
// The OpenMP team the next parallel kernel called from this thread gets (follow_load() applied
// first): lets a benchmark state how many threads its timings used.
int team_threads();
int64_t lookup(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids, int64_t n,
               void* out);
int64_t lookup_pooled(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids,
                      int64_t n, const int64_t* offsets, int64_t bags, const float* weights, int combiner,
                      float* out);
void dense_accumulate(float* out, const float* const* grads, int num_grads, int64_t n, float scale);
void dense_update(const OptParams& p, float* param, const float* grad, const OptSlots& s, int64_t n);
int64_t sparse_update(const OptParams& p, float* table, int64_t rows, int64_t dim, const int64_t* ids,
                      int64_t n, const float* grads, const OptSlots& s);
// The same for ids the caller knows to be unique (e.g. a PS's rows of ids it checked to be
// strictly increasing): each row is updated straight from its gradient, with no ranking. With
// repeated ids the result is undefined (threads race on a row); ids out of range are still
// refused before any update.
int64_t sparse_update_unique(const OptParams& p, float* table, int64_t rows, int64_t dim, const int64_t* ids,
                             int64_t n, const float* grads, const OptSlots& s);

// Sums rows of grads that share an id, for ids already deduplicated by `d` (dedup_cpu.h):
// out_ids[0..u) = sorted unique ids, out[k] = sum of their rows in original order.
// The same from bitmap ranks (range_rank_cpu.h), for ids in a narrow range.
class Dedup;
class RangeRank;
void aggregate_rows(Dedup& d, const float* grads, int64_t dim, int64_t* out_ids, float* out);
void aggregate_rows(RangeRank& r, const float* grads, int64_t dim, int64_t* out_ids, float* out);
}  // namespace cpu

// The CUDA kernels sum an id's rows in chunks of this many positions (one warp each), then
// the chunk sums in order; the CPU sums left to right. Both agree bit for bit on ids seen at
// most this many times.
constexpr int64_t kCudaSumChunk = 32;

#ifdef EDL_WITH_CUDA
namespace cuda {
int device_count();
// The virtual architectures this object was compiled for, as nvcc defines them from the
// -gencode flags (__CUDA_ARCH_LIST__), e.g. {800, 900}; read without a GPU.
std::vector<int> compiled_archs();
// CUDART_VERSION of the runtime linked into the module, e.g. 13000.
int runtime_version();
// All pointers are device pointers; each call runs on the legacy default stream and returns
// after its work is queued, except where it must read a result (bad id, unique count).
int64_t lookup(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids, int64_t n,
               void* out);
int64_t lookup_pooled(const void* table, int dtype, int64_t rows, int64_t dim, const int64_t* ids,
                      int64_t n, const int64_t* offsets, int64_t bags, const float* weights, int combiner,
                      float* out);
// Returns the number of unique ids written to out_ids/out (each sized n rows).
int64_t aggregate(const int64_t* ids, int64_t n, const float* grads, int64_t dim, int64_t* out_ids,
                  float* out);
void dense_accumulate(float* out, const float* const* grads, int num_grads, int64_t n, float scale);
void dense_update(const OptParams& p, float* param, const float* grad, const OptSlots& s, int64_t n);
int64_t sparse_update(const OptParams& p, float* table, int64_t rows, int64_t dim, const int64_t* ids,
                      int64_t n, const float* grads, const OptSlots& s);
}  // namespace cuda
#endif

}  // namespace edl
