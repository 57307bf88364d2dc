// RowwiseInt8MatMul's scalar pieces (declared in ops/rowwise_int8_matmul_common.h): baseline x86-64 code with no
// onnxruntime, linked by the library and the size-sweep tester (tests/native/sweep.cc).
#include "rowwise_int8_matmul_common.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/simd_math.h"
#include "common/weight_arena.h"

namespace sd {
namespace rowwise_int8 {
namespace {

constexpr float kMinScale = 0x1p-126f;  // as in the AVX2 unit

constexpr int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

}  // namespace

// The largest of 4, 2, 1 vpmaddubsw results that may be summed in int16 for activations on 0..levels (0: not even
// single pairs are exact). See the lane bound in ops/rowwise_int8_matmul_kernels.h.
int LaneGroups(const int8_t* b, int64_t K, int64_t N, int levels) {
  const int64_t blocks = RoundUp(K, kKB) / kKB;
  bool ok[3] = {true, true, true};  // groups 1, 2, 4
  for (int64_t n = 0; n < N && ok[0]; ++n) {
    for (int64_t i = 0; i < blocks; ++i) {
      int32_t pos[4][2] = {}, neg[4][2] = {};  // per group g and pair p
      for (int g = 0; g < 4; ++g) {
        for (int t = 0; t < 4; ++t) {
          const int64_t k = i * kKB + 4 * g + t;
          const int32_t w = k < K ? b[k * N + n] : 0;
          if (w > 0) {
            pos[g][t / 2] += w;
          } else {
            neg[g][t / 2] += w;
          }
        }
      }
      for (int p = 0; p < 2; ++p) {
        const auto fits = [&](int g0, int count) {
          int32_t sp = 0, sn = 0;
          for (int g = g0; g < g0 + count; ++g) sp += pos[g][p], sn += neg[g][p];
          return levels * sp <= 32767 && levels * sn >= -32768;
        };
        for (int g = 0; g < 4; ++g) ok[0] = ok[0] && fits(g, 1);
        ok[1] = ok[1] && fits(0, 2) && fits(2, 2);
        ok[2] = ok[2] && fits(0, 4);
      }
    }
  }
  return ok[2] ? 4 : ok[1] ? 2 : ok[0] ? 1 : 0;
}

// Column sums always; the lane bound for the vpmaddubsw paths; panels on every vector path (widened where the lane
// bound gives groups 0 on a vpmaddubsw path), in weight storage when kept.
Packed Pack(const int8_t* b, int64_t K, int64_t N, int levels, Path path, bool kept) {
  Packed p;
  p.K = K;
  p.N = N;
  p.kp = RoundUp(K, kKB);
  p.np = RoundUp(N, kNR);
  p.colsum.assign(static_cast<size_t>(p.np), 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) p.colsum[n] += b[k * N + n];
  }
  if (path == Path::kPortable) return p;
  if (path == Path::kAvx2 || path == Path::kAvx512Bw) {
    p.groups = LaneGroups(b, K, N, levels);
    if (p.groups == 0) p.width = 2;  // the widened packing: exact for every int8 B
  }
  const size_t bytes = static_cast<size_t>(p.kp * p.np * p.width);
  p.panels = kept ? AllocateWeightStorage(bytes)
                  : std::shared_ptr<uint8_t>(new uint8_t[bytes], std::default_delete<uint8_t[]>());
  if (p.width == 2) {  // layout: ops/rowwise_int8_matmul_kernels.h
    std::memset(p.panels.get(), 0, bytes);  // K and N padding (the int8 loop below writes every byte itself)
    for (int64_t n0 = 0; n0 < p.np; n0 += kNR) {
      int16_t* panel = reinterpret_cast<int16_t*>(p.panels.get()) + n0 * p.kp;
      for (int64_t k = 0; k < K; ++k) {
        for (int64_t c = 0; c < kNR && n0 + c < N; ++c) panel[(k / 2) * 2 * kNR + 2 * c + k % 2] = b[k * N + n0 + c];
      }
    }
    return p;
  }
  for (int64_t n0 = 0; n0 < p.np; n0 += kNR) {
    int8_t* panel = reinterpret_cast<int8_t*>(p.panels.get()) + n0 * p.kp;
    for (int64_t i = 0; i < p.kp / kKB; ++i) {
      for (int g = 0; g < 4; ++g) {
        for (int h = 0; h < 2; ++h) {
          int8_t* vec = panel + i * 8 * 32 + (g * 2 + h) * 32;
          for (int j = 0; j < 8; ++j) {
            const int64_t n = n0 + 8 * h + j;
            for (int t = 0; t < 4; ++t) {
              const int64_t k = i * kKB + 4 * g + t;
              vec[4 * j + t] = k < K && n < N ? b[k * N + n] : 0;
            }
          }
        }
      }
    }
  }
  return p;
}

// The portable row quantization: the AVX2 unit's operations, one entry at a time. Returns the first bad row or -1.
int64_t QuantizeRowsPortable(const float* x, int64_t M, int64_t K, int64_t kp, int levels, uint8_t* xq, float* sa,
                             int32_t* za) {
  const float top = static_cast<float>(levels);
  for (int64_t m = 0; m < M; ++m) {
    const float* row = x + m * K;
    float mn = 0.f, mx = 0.f, bad = 0.f;
    for (int64_t k = 0; k < K; ++k) {
      mn = row[k] < mn ? row[k] : mn;
      mx = row[k] > mx ? row[k] : mx;
      bad += row[k] * 0.f;  // NaN once any entry is NaN or +-inf
    }
    const float range = mx - mn;
    if (bad != bad || !(range <= 3.40282347e38f)) return m;
    float scale = range / top;
    if (!(scale >= kMinScale)) scale = 1.f;
    const float neg_lo = -mn / scale;
    const float zp = std::nearbyint(neg_lo < 0.f ? 0.f : (neg_lo > top ? top : neg_lo));
    sa[m] = scale;
    za[m] = static_cast<int32_t>(zp);
    const float inv = 1.f / scale;
    uint8_t* dst = xq + m * kp;
    int64_t k = 0;
    for (; k < K; ++k) {
      const float q = std::nearbyint(row[k] * inv) + zp;
      dst[k] = static_cast<uint8_t>(q < 0.f ? 0.f : (q > top ? top : q));
    }
    for (; k < kp; ++k) dst[k] = static_cast<uint8_t>(zp);
  }
  return -1;
}

void GemmPortable(const int8_t* b, int64_t K, int64_t N, const int32_t* colsum, const uint8_t* xq, int64_t kp,
                  const float* sa, const int32_t* za, int64_t M, const float* sb, const float* bias, float* y,
                  int64_t n0, int64_t n1, Activation act, const float* residual) {
  std::vector<int32_t> acc(static_cast<size_t>(n1 - n0));
  for (int64_t m = 0; m < M; ++m) {
    std::fill(acc.begin(), acc.end(), 0);
    const uint8_t* q = xq + m * kp;
    for (int64_t k = 0; k < K; ++k) {
      const int32_t qk = q[k];
      const int8_t* brow = b + k * N + n0;
      for (int64_t n = 0; n < n1 - n0; ++n) acc[n] += qk * brow[n];
    }
    float* yrow = y + m * N;
    for (int64_t n = n0; n < n1; ++n) {
      const float v = static_cast<float>(acc[n - n0] - za[m] * colsum[n]);
      float o = std::fma(v, sa[m] * sb[n], bias == nullptr ? 0.f : bias[n]);
      if (act == Activation::kGelu) o = simd::GeluErf(o);
      if (residual != nullptr) o += residual[m * N + n];
      yrow[n] = o;
    }
  }
}

}  // namespace rowwise_int8
}  // namespace sd
