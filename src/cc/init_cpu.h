// Initial values of lazily created embedding rows (elasticdl/ops/counter_rng.py holds the
// NumPy reference these reproduce bit for bit).
//
// A row's value at column c of stream s is a pure function of (seed, id, c, s):
//   key = splitmix64(uint64(id) ^ seed)
//   z   = mix(key + (c + s * dim + 1) * GOLDEN)      (mix: splitmix64's finaliser)
//   u   = (z >> 40) * 2^-24                          (24 bits: exact in float32, in [0, 1))
#pragma once

#include <cstdint>

namespace edl::cpu {

// out[i * dim + c] = u for ids[i], column c, stream `stream`; out is (n, dim) float32.
void uniform01(uint64_t seed, const int64_t* ids, int64_t n, int64_t dim, uint64_t stream, float* out);

// out = (2u - 1) * limit for stream 0, as NumPy evaluates it on float32 arrays: 2u - 1 is exact
// in float32; the product is a float32 multiply by float(limit) when `limit_in_double` is false,
// else a double multiply rounded once to float32 (what NumPy does where `limit` promotes the
// array to float64).
void uniform_scaled(uint64_t seed, const int64_t* ids, int64_t n, int64_t dim, double limit, bool limit_in_double,
                    float* out);

}  // namespace edl::cpu
