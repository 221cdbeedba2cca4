// One element of each optimizer update, shared by the CPU and CUDA kernels so both
// backends (and the NumPy reference, which follows the same operation order) agree bit
// for bit. Build with -ffp-contract=off (CPU) / --fmad=false (CUDA): a fused multiply-add
// would round differently from the reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels.h"

#if defined(__CUDACC__)
#define EDL_HD __host__ __device__ __forceinline__
#else
#define EDL_HD inline __attribute__((always_inline))
#endif

namespace edl {

// Applies gradient g to element i of the parameter and its slots. K is the OptKind,
// a template argument so each loop is compiled (and vectorised) for one rule.
template <int K>
EDL_HD void apply_update(const OptParams& p, float* param, const OptSlots& s, int64_t i, float g) {
  if constexpr (K == kSGD) {
    param[i] = param[i] - p.lr * g;
  } else if constexpr (K == kMomentum) {
    const float v = s.s0[i] * p.mu + g;
    s.s0[i] = v;
    param[i] = param[i] - (p.nesterov ? p.lr * (g + p.mu * v) : p.lr * v);
  } else if constexpr (K == kAdam) {
    const float m = s.s0[i] * p.beta1 + (1.0f - p.beta1) * g;
    const float v = s.s1[i] * p.beta2 + (1.0f - p.beta2) * (g * g);
    s.s0[i] = m;
    s.s1[i] = v;
    float vhat = v;
    if (p.amsgrad) {
      vhat = s.s2[i] > v ? s.s2[i] : v;
      s.s2[i] = vhat;
    }
    param[i] = param[i] - (p.lr * m) / (sqrtf(vhat) + p.eps);
  } else {  // kAdagrad
    const float acc = s.s0[i] + g * g;
    s.s0[i] = acc;
    param[i] = param[i] - (p.lr * g) / (sqrtf(acc) + p.eps);
  }
}

// Calls f(std::integral_constant<int, K>) for the runtime kind.
template <typename F>
inline void dispatch_kind(int kind, F&& f) {
  switch (kind) {
    case kSGD: f(std::integral_constant<int, kSGD>()); break;
    case kMomentum: f(std::integral_constant<int, kMomentum>()); break;
    case kAdam: f(std::integral_constant<int, kAdam>()); break;
    default: f(std::integral_constant<int, kAdagrad>()); break;
  }
}

// float16 / bfloat16 -> float32 without relying on F16C or CUDA headers.
EDL_HD float bf16_to_f32(uint16_t h) {
  union { uint32_t u; float f; } c;
  c.u = static_cast<uint32_t>(h) << 16;
  return c.f;
}

EDL_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((man & 0x400u) == 0) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  union { uint32_t u; float f; } c;
  c.u = bits;
  return c.f;
}

EDL_HD float load_as_f32(const void* base, int dtype, int64_t i) {
  if (dtype == kF32) return static_cast<const float*>(base)[i];
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return dtype == kF16 ? f16_to_f32(h) : bf16_to_f32(h);
}

EDL_HD int dtype_size(int dtype) { return dtype == kF32 ? 4 : 2; }

}  // namespace edl
