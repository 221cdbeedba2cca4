#include "init_cpu.h"

#include <omp.h>

#include <cstddef>

#include <vector>

#include "cpu_target.h"
#include "kernels.h"

namespace edl::cpu {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ull;
constexpr uint64_t kMix2 = 0x94D049BB133111EBull;
// Elements below which one thread fills the rows: a team's wake-up costs more than the work
// (measured in benchmarks/ps/README.md).
constexpr int64_t kParallelMin = int64_t{1} << 17;

// splitmix64's finaliser.
inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}

inline uint64_t row_key(int64_t id, uint64_t seed) { return mix((static_cast<uint64_t>(id) ^ seed) + kGolden); }

// The top 24 bits over 2^24: both steps exact in float32.
inline float top24(uint64_t z) { return static_cast<float>(static_cast<int32_t>(z >> 40)) * 0x1p-24f; }

// (c + stream * dim + 1) * GOLDEN for each column, wrapping modulo 2^64 as NumPy's uint64 does.
std::vector<uint64_t> column_offsets(int64_t dim, uint64_t stream) {
  std::vector<uint64_t> cols(static_cast<size_t>(dim));
  const uint64_t base = stream * static_cast<uint64_t>(dim) + 1;
  for (int64_t c = 0; c < dim; ++c) cols[c] = (static_cast<uint64_t>(c) + base) * kGolden;
  return cols;
}

EDL_MULTIVERSION
void fill_uniform01(uint64_t seed, const int64_t* ids, int64_t lo, int64_t hi, int64_t dim, const uint64_t* cols,
                    float* out) {
  for (int64_t i = lo; i < hi; ++i) {
    const uint64_t key = row_key(ids[i], seed);
    float* o = out + i * dim;
    for (int64_t c = 0; c < dim; ++c) o[c] = top24(mix(key + cols[c]));
  }
}

// (2u - 1) * limit, the product taken in Limit's precision (float, or double rounded once to
// float): whichever NumPy uses for a float32 array times the limit.
template <typename Limit>
EDL_MULTIVERSION void fill_scaled(uint64_t seed, const int64_t* ids, int64_t lo, int64_t hi, int64_t dim,
                                  const uint64_t* cols, Limit limit, float* out) {
  for (int64_t i = lo; i < hi; ++i) {
    const uint64_t key = row_key(ids[i], seed);
    float* o = out + i * dim;
    for (int64_t c = 0; c < dim; ++c) {
      const float v = 2.0f * top24(mix(key + cols[c])) - 1.0f;
      o[c] = static_cast<float>(static_cast<Limit>(v) * limit);
    }
  }
}

// Calls fill(lo, hi) over [0, n) in one contiguous slice per thread, on a team only when
// there is enough work.
template <typename Fill>
void over_rows(int64_t n, int64_t dim, Fill fill) {
  if (n * dim < kParallelMin) {
    fill(int64_t{0}, n);
    return;
  }
  follow_load();
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    fill(n * t / nt, n * (t + 1) / nt);
  }
}

}  // namespace

void uniform01(uint64_t seed, const int64_t* ids, int64_t n, int64_t dim, uint64_t stream, float* out) {
  const std::vector<uint64_t> cols = column_offsets(dim, stream);
  over_rows(n, dim, [&](int64_t lo, int64_t hi) { fill_uniform01(seed, ids, lo, hi, dim, cols.data(), out); });
}

void uniform_scaled(uint64_t seed, const int64_t* ids, int64_t n, int64_t dim, double limit, bool limit_in_double,
                    float* out) {
  const std::vector<uint64_t> cols = column_offsets(dim, 0);
  if (limit_in_double) {
    over_rows(n, dim, [&](int64_t lo, int64_t hi) { fill_scaled(seed, ids, lo, hi, dim, cols.data(), limit, out); });
  } else {
    const float limit32 = static_cast<float>(limit);
    over_rows(n, dim,
              [&](int64_t lo, int64_t hi) { fill_scaled(seed, ids, lo, hi, dim, cols.data(), limit32, out); });
  }
}

}  // namespace edl::cpu
