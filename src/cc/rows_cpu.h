// Row helpers shared by the CPU kernels (kernels_cpu.cc: lookups, dense; sparse_cpu.cc:
// aggregation, sparse updates): id checks, prefetches and row copies with optional streaming
// stores. Internal to the extension.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace edl {
namespace cpu {

// Below this many touched elements a kernel runs on one thread: the fork/join costs more.
constexpr int64_t kParallelMin = 1 << 15;

inline bool bad_id(int64_t id, int64_t rows) { return id < 0 || id >= rows; }

// First position of an id outside [0, rows), or -1.
inline int64_t first_bad_id(const int64_t* ids, int64_t n, int64_t rows) {
  int64_t bad = INT64_MAX;
#pragma omp parallel for reduction(min : bad) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    if (bad_id(ids[i], rows) && i < bad) bad = i;
  }
  return bad == INT64_MAX ? -1 : bad;
}

// Outputs at least this large are written with non-temporal stores: they do not fit in cache
// anyway, and streaming stores skip the read-for-ownership of every destination line.
constexpr size_t kStreamMinBytes = size_t{4} << 20;

inline void prefetch_row(const char* r, size_t row_bytes) {
  for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(r + b, 0, 3);
}

// Prefetches a row of `dim` floats, for reading (rw = 0) or writing (rw = 1).
inline void prefetch_rows(const float* r, int64_t dim, int rw) {
  for (int64_t b = 0; b < dim; b += 16) {
    if (rw) {
      __builtin_prefetch(r + b, 1, 3);
    } else {
      __builtin_prefetch(r + b, 0, 3);
    }
  }
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

// Whole 64-byte destination lines, aligned: rows can be written with streaming stores.
inline bool stream_rows(const float* out, int64_t dim, int64_t rows) {
#if defined(__SSE2__)
  const size_t row_bytes = static_cast<size_t>(dim) * sizeof(float);
  return row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0 &&
         row_bytes * static_cast<size_t>(rows) >= kStreamMinBytes;
#else
  (void)out, (void)dim, (void)rows;
  return false;
#endif
}

}  // namespace cpu
}  // namespace edl
