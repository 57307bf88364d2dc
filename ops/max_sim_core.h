// The compute core shared by MaxSim and SignedMaxSim (ops/max_sim.cc, ops/signed_max_sim.cc).
//
//   best[b, n, i] = max_{j valid} s(i, j),   s(i, j) = QScale[b,i] * DScale[n,j] * <Q[b,i], D[n,j]>
//   (SignedMaxSim: also j* = the lowest valid j reaching the max, and no scales)
//
// Python halves and float64 oracles: softdeploy/ops/max_sim.py, softdeploy/ops/signed_max_sim.py.
//
// How: a tiled GEMM whose C tile never leaves the registers. Q[b] is packed once per call, transposed,
// in tiles of query tokens (32 lanes for AVX-512, 16 for AVX2); per document and tile a micro-kernel
// runs over blocks of document tokens and folds each block into a running max (and argmax) per query
// lane, so the [Lq, N * Ld] similarity matrix is never written. The micro-kernels are written once
// over the vector traits of ops/common/vec.h (ops/max_sim_kernels.h) and compiled per ISA in their own
// translation units (ops/max_sim_avx2.cc, ops/max_sim_avx512.cc; interface: ops/max_sim_tile.h);
// this header has the contract checks, the portable tile and the driver. int8 sums are exact int32:
// AVX-512 VNNI vpdpbusd on Q + 128; AVX-VNNI vpdpbusd on D + 128; other AVX2 CPUs vpmaddubsw on Q + 128 (or + 64)
// against documents within [-64, 63] (7-bit codes), and for the others |D| against Q * sign(D) from a 16-pattern
// table (query rows without -128) or vpmaddwd on int16 (ops/max_sim_avx2.cc).
// float16 documents are widened to float32 one document at a time (F16C).
//
// What must stay true:
//  * masked document tokens never enter the max, NaN test or argmax (their similarities are
//    computed with the block and ignored); NaN in a valid pair makes the lane NaN at the end;
//  * argmax ties -> lowest j: the update is strictly greater, blocks run in increasing j, and the
//    index starts at the first valid token (so an all -inf row picks that token);
//  * per (b, n) the sum over query tokens runs in increasing i whatever the ISA or thread count;
//  * int8 sums are exact: |sum| <= dim * 128 * 255 < 2^31 for dim < 65793 (checked by the caller).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "common/kernel.h"
#include "max_sim_tile.h"

namespace sd {
namespace maxsim {

// 64-byte aligned storage for packed Q tiles (aligned vector loads).
template <class V>
struct AlignedAllocator {
  using value_type = V;
  AlignedAllocator() = default;
  template <class U>
  AlignedAllocator(const AlignedAllocator<U>&) {}
  V* allocate(size_t n) {
    void* ptr = ::operator new(n * sizeof(V) + 64, std::align_val_t(64));
    return static_cast<V*>(ptr);
  }
  void deallocate(V* ptr, size_t) { ::operator delete(ptr, std::align_val_t(64)); }
  template <class U>
  bool operator==(const AlignedAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const AlignedAllocator<U>&) const { return false; }
};

// The whole problem, element type erased. Q/D data are float32 or int8 here (float16 widened).
struct Problem {
  int64_t B = 0, Lq = 0, N = 0, Ld = 0, dim = 0;
  const bool* q_mask = nullptr;   // [B, Lq] or null (all valid)
  const bool* d_mask = nullptr;   // [N, Ld] or null
  const float* q_scale = nullptr; // [B, Lq] or null (1)
  const float* d_scale = nullptr; // [N, Ld] or null (1)
  const float* q_sign = nullptr;  // [B, Lq], SignedMaxSim only
  const float* d_sign = nullptr;  // [N, Ld], SignedMaxSim only
  bool signed_max = false;
};

// The contract checks MaxSim and SignedMaxSim share: Q [B, Lq, dim] and D [N, Ld, dim] -> the
// problem's sizes. Messages name the op, the value and the rule.
template <class T>
Problem ProblemOf(const char* op, const Input<T>& q, const Input<T>& d) {
  if (q.rank() != 3) Fail(op, "Q must have rank 3 [B, Lq, dim], got shape ", ShapeStr(q.shape));
  if (d.rank() != 3) Fail(op, "D must have rank 3 [N, Ld, dim], got shape ", ShapeStr(d.shape));
  Problem p;
  p.B = q.shape[0], p.Lq = q.shape[1], p.dim = q.shape[2];
  p.N = d.shape[0], p.Ld = d.shape[1];
  if (d.shape[2] != p.dim) {
    Fail(op, "Q has dim ", p.dim, " but D has dim ", d.shape[2], " (rule: Q and D share the last dimension)");
  }
  return p;
}

// A per-token side input (mask, scale, sign) present with the wrong shape -> contract error.
template <class V>
void CheckSide(const char* op, const Input<V>& x, const char* port, int64_t rows, int64_t cols, const char* dims) {
  if (x.present && x.shape != std::vector<int64_t>{rows, cols}) {
    Fail(op, port, " has shape ", ShapeStr(x.shape), ", expected ", dims, " = [", rows, ", ", cols, "]");
  }
}

// Folds the per-lane results of one tile into the scores of (b, n): increasing i.
inline float SumTile(const Problem& p, const TileResult& r, int64_t b, int64_t n, int64_t i0, int64_t lanes,
                     float sum) {
  for (int64_t l = 0; l < lanes; ++l) {
    const int64_t i = i0 + l;
    if (p.q_mask != nullptr && !p.q_mask[b * p.Lq + i]) continue;
    float c;
    if (r.nan[l]) {
      c = std::numeric_limits<float>::quiet_NaN();
    } else if (p.signed_max) {
      c = p.q_sign[b * p.Lq + i] * p.d_sign[n * p.Ld + r.idx[l]] * r.best[l];
    } else {
      c = r.best[l];
    }
    sum += c;
  }
  return sum;
}

// ================================================================================================
// Portable: one query token at a time.

template <class E>
void TilePortable(const Problem& p, const E* q /*[dim]*/, float q_scale, const Doc& doc, TileResult* r) {
  float best = -std::numeric_limits<float>::infinity();
  int32_t idx = static_cast<int32_t>(doc.first_valid);
  bool nan = false;
  const E* d = static_cast<const E*>(doc.data);
  for (int64_t j = 0; j < p.Ld; ++j) {
    if (!doc.valid[j]) continue;
    float s;
    if constexpr (std::is_same_v<E, int8_t>) {
      int32_t acc = 0;
      for (int64_t k = 0; k < p.dim; ++k) acc += int32_t{q[k]} * int32_t{d[j * p.dim + k]};
      s = static_cast<float>(acc);
    } else {
      s = 0.0f;
      for (int64_t k = 0; k < p.dim; ++k) s += q[k] * d[j * p.dim + k];
    }
    if (doc.scale != nullptr) s *= doc.scale[j];
    s *= q_scale;
    if (std::isnan(s)) nan = true;
    if (s > best) {
      best = s;
      idx = static_cast<int32_t>(j);
    }
  }
  r->best[0] = best;
  r->idx[0] = idx;
  r->nan[0] = nan;
}

// ================================================================================================
// SIMD packing and helpers.

// Packs Q[b] (float32 [Lq, dim]) into tiles [tiles][dim][lanes], zero-padded past Lq.
template <int kLanes>
inline void PackQFloat(const float* q, int64_t Lq, int64_t dim, float* out) {
  const int64_t tiles = (Lq + kLanes - 1) / kLanes;
  // No memset of nothing: with Lq or dim 0, out is an empty vector's data(), null (UB for memset,
  // reported by the UBSan build of .ci/run's sanitizer stage).
  if (tiles * dim == 0) return;
  std::memset(out, 0, sizeof(float) * tiles * dim * kLanes);
  for (int64_t i = 0; i < Lq; ++i) {
    float* tile = out + (i / kLanes) * dim * kLanes + (i % kLanes);
    for (int64_t k = 0; k < dim; ++k) tile[k * kLanes] = q[i * dim + k];
  }
}

// Ort::Float16_t is its 16 bits (WidenF16Avx2 reads them as uint16_t).
static_assert(sizeof(Ort::Float16_t) == 2, "float16 is 2 bytes");

inline bool HasVnni() noexcept {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
}
// AVX-VNNI (VEX vpdpbusd on ymm: Alder Lake and later, Zen 5) is KernelsUseAvxVnni() (ops/common/cpu.h),
// read once per kernel instance, at session creation, like the ISA (MaxSimKernel).
// (CpuHasF16c: ops/common/cpu.h, CPUID under every compiler.)
inline bool HasF16c() noexcept { return CpuHasF16c(); }

// ================================================================================================
// The driver: packs Q, splits documents over onnxruntime's pool, writes Scores [B, N].

enum class Path { kPortable, kAvx2, kAvx2Vnni, kAvx512, kAvx512Vnni };

// int8 on an AVX-512 CPU without AVX-512 VNNI takes the best AVX2 int8 path.
// avx_vnni: KernelsUseAvxVnni() as the kernel instance saw it.
inline Path ChoosePath(Isa isa, bool int8, bool avx_vnni) {
  if (isa == Isa::kPortable) return Path::kPortable;
  if (!int8) return isa == Isa::kAvx512 ? Path::kAvx512 : Path::kAvx2;
  if (isa == Isa::kAvx512 && HasVnni()) return Path::kAvx512Vnni;
  return avx_vnni ? Path::kAvx2Vnni : Path::kAvx2;
}

inline int64_t LanesOf(Path path) {
  switch (path) {
    case Path::kAvx512:
    case Path::kAvx512Vnni: return 32;
    case Path::kAvx2:
    case Path::kAvx2Vnni: return 16;
    default: return 1;
  }
}

// T: float, Ort::Float16_t or int8_t. `scores` is [B, N]. Validation is the caller's, done before.
template <class T>
void Run(Ort::KernelContext& ctx, const Problem& p, const T* q, const T* d, Isa isa, bool avx_vnni, float* scores) {
  constexpr bool kInt8 = std::is_same_v<T, int8_t>;
  constexpr bool kHalf = std::is_same_v<T, Ort::Float16_t>;
  using E = std::conditional_t<kInt8, int8_t, float>;  // element type the tiles read
  if (p.B == 0 || p.N == 0) return;
  const Path path = ChoosePath(isa, kInt8, avx_vnni);
  const int64_t lanes = LanesOf(path);
  const int64_t tiles = (p.Lq + lanes - 1) / lanes;
  const bool half_simd = kHalf && path != Path::kPortable && HasF16c();

  // Q as E [B, Lq, dim] (float16 widened once).
  std::vector<float> q_wide;
  const E* qe;
  if constexpr (kHalf) {
    q_wide.resize(static_cast<size_t>(p.B * p.Lq * p.dim));
    for (size_t i = 0; i < q_wide.size(); ++i) q_wide[i] = q[i].ToFloat();
    qe = q_wide.data();
  } else {
    qe = q;
  }

  // Packed Q tiles per batch row (see max_sim_tile.h for the layouts) and the AVX-VNNI lane biases.
  const int64_t dim4 = (p.dim + 3) / 4, dim2 = (p.dim + 1) / 2;
  int64_t tile_bytes = 0;  // bytes of one packed tile
  switch (path) {
    case Path::kAvx512:
    case Path::kAvx2: tile_bytes = kInt8 ? dim2 * 2 * lanes * 2 : p.dim * lanes * 4; break;
    case Path::kAvx512Vnni:
    case Path::kAvx2Vnni: tile_bytes = dim4 * 4 * lanes; break;
    default: break;
  }
  const size_t packs = static_cast<size_t>(p.B * tiles);
  std::vector<uint8_t, AlignedAllocator<uint8_t>> qpack(path == Path::kPortable ? 0 : packs * tile_bytes);
  // int8 without VNNI: Q also packed as u8 = Q + c for the vpmaddubsw tiles of 7-bit documents (ops/max_sim_avx2.cc):
  // c = 64 and the paired tile (TileI8Avx2Ubs2) for a batch row whose every entry lies in [-64, 63], else 128
  const bool ubs = kInt8 && path == Path::kAvx2;
  const int64_t ubs_tile_bytes = dim4 * 4 * lanes;
  std::vector<uint8_t, AlignedAllocator<uint8_t>> qpack_ubs(ubs ? packs * ubs_tile_bytes : 0);
  std::vector<uint8_t> q_seven(ubs ? static_cast<size_t>(p.B) : 0);
  if constexpr (kInt8) {
    for (int64_t b = 0; b < static_cast<int64_t>(q_seven.size()); ++b) {
      const int8_t* qb = qe + b * p.Lq * p.dim;
      q_seven[b] = std::all_of(qb, qb + p.Lq * p.dim, [](int8_t v) { return v >= -64 && v <= 63; });
    }
  }
  // ... and, for 8-bit documents and a row without -128 (quantize_tokens never writes it), as the sign table of
  // TileI8Avx2Tab: per group Q under each of the 16 sign patterns of a document group. Rows with -128 keep the
  // vpmaddwd tile there.
  std::vector<uint8_t> q_tab(ubs ? static_cast<size_t>(p.B) : 0);
  if constexpr (kInt8) {
    for (int64_t b = 0; b < static_cast<int64_t>(q_tab.size()); ++b) {
      const int8_t* qb = qe + b * p.Lq * p.dim;
      q_tab[b] = std::none_of(qb, qb + p.Lq * p.dim, [](int8_t v) { return v == -128; });
    }
  }
  const bool any_tab = std::any_of(q_tab.begin(), q_tab.end(), [](uint8_t v) { return v != 0; });
  const bool all_tab = std::all_of(q_tab.begin(), q_tab.end(), [](uint8_t v) { return v != 0; });
  const int64_t tab_tile_bytes = dim4 * 16 * 4 * lanes;
  std::vector<uint8_t, AlignedAllocator<uint8_t>> qpack_tab(any_tab ? packs * tab_tile_bytes : 0);
  // the lane biases of AVX-VNNI's u8 x s8 tile: 128 * sum_k Q[i, k] for documents stored as D + 128
  std::vector<int32_t> qbias(path == Path::kAvx2Vnni ? packs * lanes : 0);
  auto q_at = [&](int64_t b, int64_t i, int64_t k) { return qe[(b * p.Lq + i) * p.dim + k]; };
  if constexpr (!kInt8) {
    if (path != Path::kPortable) {
      float* qf = reinterpret_cast<float*>(qpack.data());
      for (int64_t b = 0; b < p.B; ++b) {
        if (lanes == 32) PackQFloat<32>(qe + b * p.Lq * p.dim, p.Lq, p.dim, qf + b * tiles * p.dim * 32);
        else PackQFloat<16>(qe + b * p.Lq * p.dim, p.Lq, p.dim, qf + b * tiles * p.dim * 16);
      }
    }
  } else if (path != Path::kPortable) {
    std::fill(qpack.begin(), qpack.end(), uint8_t{0});
    std::fill(qpack_ubs.begin(), qpack_ubs.end(), uint8_t{0});
    std::fill(qpack_tab.begin(), qpack_tab.end(), uint8_t{0});
    for (int64_t b = 0; b < p.B; ++b) {
      for (int64_t i = 0; i < p.Lq; ++i) {
        const int64_t t = i / lanes, l = i % lanes;
        uint8_t* tile = qpack.data() + (b * tiles + t) * tile_bytes;
        int32_t sum = 0;
        for (int64_t k = 0; k < p.dim; ++k) {
          const int8_t v = q_at(b, i, k);
          sum += v;
          if (path == Path::kAvx512Vnni) {
            tile[(k / 4) * lanes * 4 + l * 4 + k % 4] = static_cast<uint8_t>(v + 128);
          } else if (path == Path::kAvx2Vnni) {
            tile[(k / 4) * lanes * 4 + l * 4 + k % 4] = static_cast<uint8_t>(v);
          } else {
            const int16_t w = v;
            std::memcpy(tile + ((k / 2) * lanes * 2 + l * 2 + k % 2) * 2, &w, 2);
            qpack_ubs[(b * tiles + t) * ubs_tile_bytes + (k / 4) * lanes * 4 + l * 4 + k % 4] =
                static_cast<uint8_t>(v + (q_seven[b] ? 64 : 128));
            if (q_tab[b]) {  // |v| <= 127: -v fits s8
              uint8_t* row = qpack_tab.data() + (b * tiles + t) * tab_tile_bytes + (k / 4) * 16 * lanes * 4 + l * 4 + k % 4;
              for (int pattern = 0; pattern < 16; ++pattern) {
                row[pattern * lanes * 4] = static_cast<uint8_t>((pattern >> (k % 4)) & 1 ? -v : v);
              }
            }
          }
        }
        if (!qbias.empty()) qbias[(b * tiles + t) * lanes + l] = 128 * sum;
      }
    }
  }

  // per packed tile: its query scales all finite and > 0 (the int8 tiles may then apply them once, at the end).
  // Sized whenever scales are given (float inputs accept them too), so qpos[pack] is valid wherever qs is.
  std::vector<uint8_t> qpos(p.q_scale != nullptr ? packs : 0);
  for (size_t pack = 0; pack < qpos.size(); ++pack) {
    const int64_t b = static_cast<int64_t>(pack) / tiles, i0 = static_cast<int64_t>(pack) % tiles * lanes;
    const float* qs = p.q_scale + b * p.Lq + i0;
    qpos[pack] = std::all_of(qs, qs + std::min(lanes, p.Lq - i0), [](float s) { return std::isfinite(s) && s > 0; });
  }
  const size_t tasks = NumTasks(p.N, p.B * p.Lq * p.Ld * std::max<int64_t>(p.dim, 1));
  const int64_t doc_elems = p.Ld * p.dim;
  // Per-task scratch for one document in the tile's layout (float16 widened, int8 as int16 or u8).
  int64_t scratch = 0;
  if (kHalf) scratch = doc_elems * 4;
  // int16 copy (8-bit documents), then |D| and sign patterns (the sign-table tile)
  const int64_t wide_bytes = (p.Ld * dim2 * 2 * 2 + 63) / 64 * 64;
  if (kInt8 && path == Path::kAvx2) scratch = wide_bytes + TabDocBytes(p.Ld, dim4);
  if (kInt8 && path == Path::kAvx2Vnni) scratch = p.Ld * dim4 * 4;
  std::vector<uint8_t> valid(tasks * static_cast<size_t>(p.Ld));
  // per task, the document's token sums: 128 * sum_k D (AVX-512 VNNI) or sum_k D (the vpmaddubsw tiles)
  std::vector<int32_t> dsum(path == Path::kAvx512Vnni || ubs ? tasks * static_cast<size_t>(p.Ld) : 0);

  ParallelFor(ctx, tasks, [&](size_t task) {
    int64_t n0, n1;
    TaskRange(task, tasks, p.N, &n0, &n1);
    uint8_t* v = valid.data() + task * p.Ld;
    // Allocated per task, uninitialised (every byte a tile reads is written first): one buffer for
    // all tasks, zero-filled by std::vector, cost 256 tasks x 92 KB of page faults per call
    // (float16, N = 100: 11 ms for 2.4 ms of compute).
    std::unique_ptr<uint8_t[]> work_mem(scratch > 0 ? new uint8_t[static_cast<size_t>(scratch) + 64] : nullptr);
    uint8_t* work = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(work_mem.get()) + 63) / 64 * 64);
    TileResult res;
    std::vector<TileResult> results(static_cast<size_t>(tiles));
    for (int64_t n = n0; n < n1; ++n) {
      Doc doc;
      doc.first_valid = -1;
      for (int64_t j = 0; j < p.Ld; ++j) {
        v[j] = p.d_mask == nullptr || p.d_mask[n * p.Ld + j];
        if (v[j] && doc.first_valid < 0) doc.first_valid = j;
      }
      if (doc.first_valid < 0) {  // no valid token: 0 for every query token
        for (int64_t b = 0; b < p.B; ++b) scores[b * p.N + n] = 0.0f;
        continue;
      }
      doc.valid = v;
      doc.stride = doc_elems;
      doc.scale = p.d_scale == nullptr ? nullptr : p.d_scale + n * p.Ld;
      doc.scale_finite = doc.scale == nullptr || std::all_of(doc.scale, doc.scale + p.Ld, [](float s) { return std::isfinite(s); });
      doc.data = d + n * doc_elems;
      if constexpr (kHalf) {
        float* w = reinterpret_cast<float*>(work);
        const Ort::Float16_t* src = d + n * doc_elems;
        if (half_simd) WidenF16Avx2(reinterpret_cast<const uint16_t*>(src), w, doc_elems);
        else for (int64_t i = 0; i < doc_elems; ++i) w[i] = src[i].ToFloat();
        doc.data = w;
      }
      bool doc_ubs = false;  // this document takes the vpmaddubsw tiles: all its entries in [-64, 63]
      Doc doc_tab = doc;     // an 8-bit document as the sign-table tile reads it
      if constexpr (kInt8) {
        const int8_t* dn = d + n * doc_elems;
        if (path == Path::kAvx512Vnni) DocSums128Avx512Vnni(dn, p.Ld, p.dim, dsum.data() + task * p.Ld);
        if (ubs) doc_ubs = DocSums7Avx2(dn, p.Ld, p.dim, dsum.data() + task * p.Ld);  // stops at an 8-bit token
        if (ubs && !doc_ubs && any_tab) {
          PrepTabAvx2(dn, p.Ld, p.dim, work + wide_bytes);
          doc_tab.data = work + wide_bytes;
        }
        if (path == Path::kAvx2 && !doc_ubs && !all_tab) WidenI8Avx2(dn, p.Ld, p.dim, reinterpret_cast<int16_t*>(work));
        if (path == Path::kAvx2Vnni) BiasI8Avx2(dn, p.Ld, p.dim, work);
        if ((path == Path::kAvx2 && !doc_ubs) || path == Path::kAvx2Vnni) doc.data = work;
      }
      for (int64_t b = 0; b < p.B; ++b) {
        float sum = 0.0f;
        const float* qs_b = p.q_scale == nullptr ? nullptr : p.q_scale + b * p.Lq;
        if (!kInt8 && (path == Path::kAvx512 || path == Path::kAvx2)) {
          // float32: all tiles of the query in one pass over the document (max_sim_kernels.h)
          TileArgs a;
          a.Ld = p.Ld;
          a.dim = p.dim;
          a.qp = qpack.data() + static_cast<size_t>(b * tiles) * tile_bytes;
          a.qscale = qs_b;
          a.count = p.Lq;
          a.tiles = tiles;
          a.tile_stride = tile_bytes;
          if (path == Path::kAvx512) TileF32Avx512(a, p.signed_max, doc, results.data());
          else TileF32Avx2(a, p.signed_max, doc, results.data());
          for (int64_t t = 0; t < tiles; ++t) {
            sum = SumTile(p, results[t], b, n, t * lanes, std::min(lanes, p.Lq - t * lanes), sum);
          }
          scores[b * p.N + n] = sum;
          continue;
        }
        for (int64_t t = 0; t < tiles; ++t) {
          const int64_t i0 = t * lanes, count = std::min(lanes, p.Lq - i0);
          const float* qs = qs_b == nullptr ? nullptr : qs_b + i0;
          const size_t pack = static_cast<size_t>(b * tiles + t);
          TileArgs a;
          a.Ld = p.Ld;
          a.dim = p.dim;
          a.qp = qpack.data() + pack * tile_bytes;
          a.qscale = qs;
          a.count = count;
          a.qscale_positive = qs != nullptr && qpos[pack];
          switch (path) {
            case Path::kAvx512Vnni:
              a.bias = dsum.data() + task * p.Ld;
              if constexpr (kInt8) TileI8Avx512Vnni(a, doc, &res);
              break;
            case Path::kAvx2Vnni:
              a.bias = qbias.data() + pack * lanes;
              if constexpr (kInt8) TileI8AvxVnni(a, doc, &res);
              break;
            case Path::kAvx2:
              if constexpr (kInt8) {
                if (doc_ubs) {
                  a.qp = qpack_ubs.data() + pack * ubs_tile_bytes;
                  a.bias = dsum.data() + task * p.Ld;
                  if (q_seven[b]) TileI8Avx2Ubs2(a, doc, &res);
                  else TileI8Avx2Ubs(a, doc, &res);
                } else if (q_tab[b]) {
                  a.qp = qpack_tab.data() + pack * tab_tile_bytes;
                  TileI8Avx2Tab(a, doc_tab, &res);
                } else {
                  TileI8Avx2I16(a, doc, &res);
                }
              }
              break;
            default:
              TilePortable<E>(p, qe + (b * p.Lq + i0) * p.dim, qs == nullptr ? 1.0f : qs[0], doc, &res);
          }
          sum = SumTile(p, res, b, n, i0, count, sum);
        }
        scores[b * p.N + n] = sum;
      }
    }
  });
}

}  // namespace maxsim
}  // namespace sd
