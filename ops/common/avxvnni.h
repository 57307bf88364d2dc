// The one instruction that makes a unit AVX-VNNI: vpdpbusd on ymm, VEX-encoded (Alder Lake and later Intel cores,
// Zen 5). The AVX-VNNI units (ops/max_sim_avxvnni.cc, ops/rowwise_int8_matmul_avxvnni.cc) name it SD_DPBUSD_YMM and
// their exported functions SD_AVXVNNI_NAME(f), so that the size-sweep tester can compile the very same source a
// second time with SD_AVXVNNI_AS_EVEX defined: vpdpbusd's EVEX encoding of the same operation (AVX-512 VNNI + VL,
// e.g. Ice Lake, Sapphire Rapids, Zen 4), under names ending in Evex (tests/native/*_avxvnni_evex.cc). A CPU
// without AVX-VNNI thus sweeps the AVX-VNNI tiles' logic; only the VEX encoding itself then runs untested.
//
// vpdpbusd (both encodings): acc[i] += sum_{t<4} uint8(a[4i+t]) * int8(b[4i+t]), exact in int32, no saturation.
#pragma once

#include <immintrin.h>

#if defined(SD_AVXVNNI_AS_EVEX)
#define SD_DPBUSD_YMM(acc, a_u8, b_s8) _mm256_dpbusd_epi32(acc, a_u8, b_s8)
#define SD_AVXVNNI_NAME(f) f##Evex
#else
#define SD_DPBUSD_YMM(acc, a_u8, b_s8) _mm256_dpbusd_avx_epi32(acc, a_u8, b_s8)
#define SD_AVXVNNI_NAME(f) f
#endif
