// Function multiversioning for the hot CPU loops: GCC clones a function marked
// EDL_MULTIVERSION for AVX2 and picks the clone at load time, so the wheel, built for baseline
// x86-64, still runs on any x86-64 CPU.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EDL_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define EDL_MULTIVERSION
#endif
