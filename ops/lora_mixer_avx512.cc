// LoRAMixer's vector pieces for AVX-512: ops/lora_mixer_kernels.h instantiated with the Avx512 traits, and
// the register-lane transpose of Bm_e (AVX-512 only: two-register permutes). Compiled with the AVX-512 flags
// and -ffp-contract=off (CMakeLists.txt); called only after the run-time ISA check of ops/lora_mixer.cc.
#include "lora_mixer_kernels.h"

namespace sd {
namespace lora_mixer {

void DotTileAvx512(const float* x0, const float* x1, const float* const* rows, int64_t n, float* out0, float* out1) {
  DotTile<vec::Avx512>(x0, x1, rows, n, out0, out1);
}

void AxpyAvx512(const float* bt, int64_t r, int64_t out, const float* c0, const float* c1, float* d0, float* d1,
                bool fresh0, bool fresh1) {
  Axpy<vec::Avx512>(bt, r, out, c0, c1, d0, d1, fresh0, fresh1);
}

bool AllFiniteAvx512(const float* p, int64_t n) { return AllFinite<vec::Avx512>(p, n); }

namespace {

// Index vectors of one stage of the register-lane transpose: exchanging a register-index bit with lane
// bit `lb` for a pair (lo: register bit 0, hi: register bit 1) is lo' = lookup2(lo, hi, a),
// hi' = lookup2(lo, hi, b).
void SwapIndices(int lb, int32_t* ia, int32_t* ib) {
  const int bit = 1 << lb;
  for (int l = 0; l < 16; ++l) {
    ia[l] = (l & bit) ? 16 + (l & ~bit) : l;
    ib[l] = (l & bit) ? 16 + l : (l | bit);
  }
}

}  // namespace

// Also returns whether the slice it read is all finite (the fused check of Bm_e: every register it loads is
// folded into one NaN-if-not-finite accumulator before the permutes; the rest by the plain scan).
bool TransposeAvx512(const float* src, int64_t out, int64_t r, float* dst) {
  using V = vec::Avx512;
  int64_t o = 0;
  const V::F zero = V::zero();
  V::F chk = zero;  // stays +0 unless a NaN or +-inf was loaded (then NaN)
  if (r == 8 && out >= 16) {
    // the usual LoRA rank: a 16 x 8 block of Bm is 8 zmm (register k = rows 2k, 2k+1); three bit
    // exchanges between register and lane index and one lane permute give its 8 columns.
    alignas(64) int32_t idx[7][16];
    for (int rb = 0; rb < 3; ++rb) SwapIndices(rb, idx[2 * rb], idx[2 * rb + 1]);
    for (int row = 0; row < 16; ++row) idx[6][row] = ((row & 1) << 3) | (row >> 1);
    V::I xa[3], xb[3];
    for (int rb = 0; rb < 3; ++rb) {
      xa[rb] = V::loadi(idx[2 * rb]);
      xb[rb] = V::loadi(idx[2 * rb + 1]);
    }
    const V::I last = V::loadi(idx[6]);
    for (; o + 16 <= out; o += 16) {
      V::F z[8];
      for (int k = 0; k < 8; ++k) {
        z[k] = V::loadu(src + (o + 2 * k) * 8);
        chk = V::fma(z[k], zero, chk);  // finite * 0 = +-0; NaN or +-inf * 0 = NaN (either fma port)
      }
      for (int rb = 2; rb >= 0; --rb) {
        const int step = 1 << rb;
        for (int k = 0; k < 8; ++k) {
          if (k & step) continue;
          const V::F lo = V::lookup2(z[k], z[k | step], xa[rb]);
          const V::F hi = V::lookup2(z[k], z[k | step], xb[rb]);
          z[k] = lo;
          z[k | step] = hi;
        }
      }
      for (int q = 0; q < 8; ++q) V::storeu(dst + q * out + o, V::lookup(z[q], last));
    }
  }
  for (int64_t q = 0; q < r; ++q)
    for (int64_t oo = o; oo < out; ++oo) dst[q * out + oo] = src[oo * r + q];
  return V::bits(V::isnan(chk)) == 0 && AllFinite<V>(src + o * r, (out - o) * r);
}

}  // namespace lora_mixer
}  // namespace sd
