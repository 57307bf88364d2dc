// SoftNMS -- Soft non-maximum suppression (Bodla et al., ICCV 2017), the original swap-based loop
// (bharatsingh430/soft-nms lib/nms/cpu_nms.pyx::cpu_soft_nms) reproduced bit for bit in float32.
//
//   per (batch, class): working rows = boxes with score >= ScoreThreshold, in index order (n rows)
//   for i = 0, 1, ... while i < n (and i < MaxOutputBoxesPerClass when > 0):
//     m = first row in [i, n) with the largest score; swap rows i and m; emit row i
//     every row p in (i, n): s_p *= weight(IoU(row i, row p))
//         linear: IoU > Nt ? 1 - IoU : 1   hard: IoU > Nt ? 0 : 1
//         gaussian: float(exp(double(-(IoU*IoU) / sigma)))
//     for p = i+1 while p < n: if !(s_p >= ScoreThreshold): row n-1 moves into p, n -= 1; else p++
//   IoU: iw = min(hi0) - max(lo0) + off, ih likewise; IoU = iw*ih / ((area_i + area_p) - iw*ih) when
//   iw > 0 and ih > 0, else 0; area = (hi0 - lo0 + off) * (hi1 - lo1 + off).
//
// Python half, the contract, the rules for NaN and the float32 oracle: softdeploy/ops/soft_nms.py; docs/ops/SoftNMS.md.
//
// How the loop is run. A row whose IoU with the selected box is 0 has weight exactly 1 (except "hard"
// with IouThreshold < 0), so its score -- and whether it survives -- does not change: each round only
// has to find and decay the rows that overlap the selected box. The working rows therefore live twice:
//  * the working order (position -> score, slot): the original loop's array, kept exactly as its
//    swaps and moves leave it, because the max search breaks ties by position;
//  * the slots: the rows' boxes (structure of arrays, areas precomputed) in sort-tile-recursive order,
//    in blocks of 16 with a bounding box each. A round tests the blocks' boxes (SIMD), runs the exact
//    IoU test on the slots of the blocks that pass (one vector each) and compresses the overlapping
//    rows' intersection, union and position into a dense "near" list, whose weights come from one
//    vector pass. Rows that leave the working set become tombstones (overlap nothing) until the
//    slots are compacted.
// At N = 5000 (the benchmark's clustered boxes) a round looks at ~13 of ~250 blocks for ~57 overlapping
// rows, instead of all ~3000 working rows.
//
// What must stay true:
//  * Every float operation is the oracle's, in the oracle's order, with no FMA contraction
//    (-ffp-contract=off from CMakeLists.txt, for this file and the vector passes): the selection
//    is discrete, so one rounding difference can pick another box.
//  * The block test is conservative (see Overlaps): a block that fails it holds no overlapping slot,
//    and the slots of the blocks that pass get the exact test, so exactly the oracle's overlapping
//    rows are decayed, each once per round, by the oracle's weight.
//  * The max search keeps the first position among equal scores; NaN never enters the working rows
//    (`!(s >= threshold)` removes it), so max/compare need no NaN care. Removal replays the original's
//    moves in ascending position order.
//  * Memory is O(N) per task, never an N x N matrix. One (batch, class) is one unit of work; threads
//    split (batch, class) pairs, never one of them.
//  * gaussian (AVX-512): the weights come from an 8-lane double exp whose float32 rounding is used only
//    where it is provably the same as float(std::exp(double)) (GaussianWeights8 in
//    ops/soft_nms_avx512.cc), so the scores stay bit-identical to the oracle.
//  * The AVX2 and AVX-512 scan / max / first-equal passes are written once over the vector traits
//    (ops/soft_nms_kernels.h); every variant gives the oracle's bits, so all variants agree.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "common/kernel.h"
#include "soft_nms_row.h"

// a*b - c and a + b*c must stay two roundings, as in the oracle: -ffp-contract=off from CMakeLists.txt
// for every file (GCC and clang would otherwise contract them into FMAs where the target has FMA, e.g.
// aarch64: -std=c++17 does not turn contraction off; clang ignores a GCC optimize pragma).

namespace sd {
namespace {

constexpr const char* kOp = "SoftNMS";
constexpr float kInf = std::numeric_limits<float>::infinity();

enum class Method { kLinear, kGaussian, kHard };

struct Params {
  Method method = Method::kLinear;
  float iou_threshold = 0.3f;
  float score_threshold = 0.001f;
  float sigma = 0.5f;
  float offset = 0.0f;
  int64_t max_output = 0;  // <= 0: no limit
  // weight(IoU 0) == 1, so rows that do not overlap the selected box keep their scores and only the
  // overlapping ones are decayed (false only for "hard" with IouThreshold < 0, where IoU 0 > Nt: then
  // every working row is decayed, by the portable pass).
  bool skip_disjoint = true;
};

constexpr int64_t kBlock = 16;  // slots per bounding box (one AVX-512 vector)

// The working rows of one (batch, class); capacity N rounded up to whole blocks (+16 where whole
// vectors are stored).
struct Work {
  // Slots: the rows' boxes in a spatially coherent order (see StrOrder), in blocks of kBlock slots
  // with a bounding box each. A tombstone (a row that was selected or removed, or padding) has pos -1
  // and hi0 -inf, so that it overlaps nothing; a block's box covers at least its live slots.
  std::vector<float> lo0, hi0, lo1, hi1, area;
  std::vector<int32_t> pos, box;
  std::vector<float> block_lo0, block_hi0, block_lo1, block_hi1;
  std::vector<int32_t> block_live;
  int64_t slots = 0, blocks = 0, tombs = 0;
  // Working order: position -> current score, slot.
  std::vector<float> score;
  std::vector<int32_t> slot;
  // This round: intersection, union and position of the rows that overlap the selected box; the
  // positions whose decayed score fell under the threshold.
  std::vector<float> near_inter, near_union;
  std::vector<int32_t> near_pos, dead;
  std::vector<int32_t> rank;  // box -> initial working position (-1: under the threshold)

  void Resize(size_t n) {
    const size_t cap = (n + kBlock - 1) / kBlock * kBlock, nb = cap / kBlock;
    for (auto* v : {&lo0, &hi0, &lo1, &hi1, &area}) v->resize(cap);
    for (auto* v : {&pos, &box}) v->resize(cap);
    for (auto* v : {&block_lo0, &block_hi0, &block_lo1, &block_hi1}) v->resize(nb);
    block_live.resize(nb);
    score.resize(n);
    slot.resize(n);
    rank.resize(n);
    for (auto* v : {&near_inter, &near_union}) v->resize(n + 16);
    for (auto* v : {&near_pos, &dead}) v->resize(n + 16);
  }
  void Tombstone(int64_t k) {
    pos[k] = -1;
    hi0[k] = -kInf;
    ++tombs;
    if (--block_live[k / kBlock] == 0) block_hi0[k / kBlock] = -kInf;  // the block overlaps nothing
  }
  void SwapPositions(int64_t a, int64_t b) {
    std::swap(score[a], score[b]);
    std::swap(slot[a], slot[b]);
    pos[slot[a]] = static_cast<int32_t>(a);
    pos[slot[b]] = static_cast<int32_t>(b);
  }
  void MovePosition(int64_t from, int64_t to) {
    score[to] = score[from];
    slot[to] = slot[from];
    pos[slot[to]] = static_cast<int32_t>(to);
  }
  // Slots [0, slots) are filled (live, or tombstones with pos -1 whose hi0 is -inf): pads them to
  // whole blocks and computes the blocks' boxes from their live slots.
  void Blocks() {
    for (; slots % kBlock != 0; ++slots) {
      lo0[slots] = lo1[slots] = hi1[slots] = area[slots] = 0.0f;
      hi0[slots] = -kInf;
      pos[slots] = -1;
    }
    blocks = slots / kBlock;
    tombs = 0;
    for (int64_t b = 0; b < blocks; ++b) {
      float l0 = kInf, h0 = -kInf, l1 = kInf, h1 = -kInf;
      int32_t live = 0;
      for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
        if (pos[k] < 0) {
          ++tombs;
          continue;
        }
        l0 = std::min(l0, lo0[k]), h0 = std::max(h0, hi0[k]), l1 = std::min(l1, lo1[k]), h1 = std::max(h1, hi1[k]);
        ++live;
      }
      block_lo0[b] = l0, block_hi0[b] = live > 0 ? h0 : -kInf, block_lo1[b] = l1, block_hi1[b] = h1;
      block_live[b] = live;
    }
  }
  // Drops the tombstones (the live slots keep their order) and rebuilds the blocks.
  void Compact() {
    int64_t w = 0;
    for (int64_t k = 0; k < slots; ++k) {
      if (pos[k] < 0) continue;
      lo0[w] = lo0[k], hi0[w] = hi0[k], lo1[w] = lo1[k], hi1[w] = hi1[k], area[w] = area[k];
      pos[w] = pos[k], box[w] = box[k];
      slot[pos[w]] = static_cast<int32_t>(w);
      ++w;
    }
    slots = w;
    Blocks();
  }
};

// The selected box, broadcast once per round.
struct Selected {
  float lo0, hi0, lo1, hi1, area;
};

// ---- portable (also the tails of the SIMD passes) ----------------------------------------------------

inline float GaussianWeight(float iou, float sigma) {
  const float t = -(iou * iou) / sigma;
  return static_cast<float>(std::exp(static_cast<double>(t)));
}

inline float Weight(float iou, const Params& prm) {
  switch (prm.method) {
    case Method::kLinear: return iou > prm.iou_threshold ? 1.0f - iou : 1.0f;
    case Method::kHard: return iou > prm.iou_threshold ? 0.0f : 1.0f;
    default: return iou == 0.0f ? 1.0f : GaussianWeight(iou, prm.sigma);  // exp(-0) is exactly 1
  }
}

// The IoU's overlap test on one axis: fl(fl(min(hi, t_hi) - max(lo, t_lo)) + off) > 0.
// On a block's box it is a bound: for a slot inside the block, min(t_hi, hi) <= min(t_hi, block hi)
// and max(t_lo, lo) >= max(t_lo, block lo), and float rounding is monotone, so the slot's iw is at
// most the block's (likewise ih); where the block's difference is NaN (inf - inf) the slot's is -inf
// or NaN. So a block that fails the test holds no slot that passes it.
inline bool Overlaps(float lo, float hi, float t_lo, float t_hi, float off) {
  return (std::min(t_hi, hi) - std::max(t_lo, lo)) + off > 0.0f;
}

// Appends the live slots of block b that overlap t to the near list from index near_n; returns the new
// length. Without skip_disjoint every live slot goes, a disjoint one as 0 / 1 (IoU 0).
int64_t ScanBlockPortable(const Selected& t, const Work& w, int64_t b, const Params& prm, int64_t near_n, Work& out) {
  const float off = prm.offset;
  for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
    if (w.pos[k] < 0) continue;
    const float iw = (std::min(t.hi0, w.hi0[k]) - std::max(t.lo0, w.lo0[k])) + off;
    const float ih = (std::min(t.hi1, w.hi1[k]) - std::max(t.lo1, w.lo1[k])) + off;
    float inter = 0.0f, uni = 1.0f;
    if (iw > 0.0f && ih > 0.0f) {
      inter = iw * ih;
      uni = (t.area + w.area[k]) - inter;
    } else if (prm.skip_disjoint) {
      continue;
    }
    out.near_inter[near_n] = inter;
    out.near_union[near_n] = uni;
    out.near_pos[near_n] = w.pos[k];
    ++near_n;
  }
  return near_n;
}

// Fills the near list with the live rows that overlap t (every live row without skip_disjoint);
// returns its length. Only the blocks whose box passes the overlap test are looked into.
int64_t ScanPortable(const Selected& t, Work& w, const Params& prm) {
  int64_t near_n = 0;
  for (int64_t b = 0; b < w.blocks; ++b) {
    const bool hit = Overlaps(w.block_lo0[b], w.block_hi0[b], t.lo0, t.hi0, prm.offset) &&
                     Overlaps(w.block_lo1[b], w.block_hi1[b], t.lo1, t.hi1, prm.offset);
    if (hit || !prm.skip_disjoint) near_n = ScanBlockPortable(t, w, b, prm, near_n, w);
  }
  return near_n;
}

// The near rows' weights, in place of their intersections: near_inter[j] = weight(inter / union).
void WeighPortable(Work& w, int64_t near_n, const Params& prm) {
  for (int64_t j = 0; j < near_n; ++j) w.near_inter[j] = Weight(w.near_inter[j] / w.near_union[j], prm);
}

// Decays the near rows by their weights; writes the positions that fall under the threshold to w.dead
// and returns their count. (Scalar: the scores are scattered over the working order, and a vector
// gather after a scatter would wait for it.)
int64_t ApplyWeights(Work& w, int64_t near_n, float threshold) {
  int64_t dead_n = 0;
  for (int64_t j = 0; j < near_n; ++j) {
    const int32_t p = w.near_pos[j];
    const float s = w.score[p] * w.near_inter[j];
    w.score[p] = s;
    w.dead[dead_n] = p;
    dead_n += !(s >= threshold);  // NaN included
  }
  return dead_n;
}

float MaxPortable(const float* s, int64_t begin, int64_t end) {
  float m0 = -kInf, m1 = -kInf, m2 = -kInf, m3 = -kInf;  // four chains: max has a latency
  int64_t p = begin;
  for (; p + 4 <= end; p += 4) {
    m0 = std::max(m0, s[p]), m1 = std::max(m1, s[p + 1]), m2 = std::max(m2, s[p + 2]), m3 = std::max(m3, s[p + 3]);
  }
  for (; p < end; ++p) m0 = std::max(m0, s[p]);
  return std::max(std::max(m0, m1), std::max(m2, m3));
}

int64_t FirstEqualPortable(const float* s, int64_t begin, int64_t end, float value) {
  for (int64_t p = begin; p < end; ++p)
    if (s[p] == value) return p;
  return end;
}

// ---- AVX2 / AVX-512: ops/soft_nms_kernels.h (one source over ops/common/vec.h), compiled in
// ops/soft_nms_avx2.cc and ops/soft_nms_avx512.cc; here only Work seen as their plain Slots ---------

static_assert(static_cast<int>(Method::kLinear) == 0 && static_cast<int>(Method::kGaussian) == 1 &&
                  static_cast<int>(Method::kHard) == 2,
              "soft_nms::WeighAvx512's method numbers");
static_assert(kBlock == soft_nms::kBlock, "one block size");

soft_nms::Slots SlotsOf(Work& w) {
  return {w.lo0.data(),       w.hi0.data(),       w.lo1.data(),       w.hi1.data(),       w.area.data(),
          w.pos.data(),       w.block_lo0.data(), w.block_hi0.data(), w.block_lo1.data(), w.block_hi1.data(),
          w.blocks,           w.near_inter.data(), w.near_union.data(), w.near_pos.data()};
}

int64_t ScanAvx2(const Selected& t, Work& w, const Params& prm) {
  return soft_nms::ScanAvx2({t.lo0, t.hi0, t.lo1, t.hi1, t.area}, SlotsOf(w), prm.offset);
}
int64_t ScanAvx512(const Selected& t, Work& w, const Params& prm) {
  return soft_nms::ScanAvx512({t.lo0, t.hi0, t.lo1, t.hi1, t.area}, SlotsOf(w), prm.offset);
}
void WeighAvx512(Work& w, int64_t near_n, const Params& prm) {
  soft_nms::WeighAvx512(w.near_inter.data(), w.near_union.data(), near_n, static_cast<int>(prm.method),
                        prm.iou_threshold, prm.sigma);
}

// ---- the loop -------------------------------------------------------------------------------------

struct Pick {
  int64_t index;
  float score;
};

using ScanFn = int64_t (*)(const Selected&, Work&, const Params&);
using WeighFn = void (*)(Work&, int64_t, const Params&);
using MaxFn = float (*)(const float*, int64_t, int64_t);
using FirstEqualFn = int64_t (*)(const float*, int64_t, int64_t, float);

struct Isafns {
  ScanFn scan;
  WeighFn weigh;
  MaxFn max;
  FirstEqualFn first_equal;
};

// One (batch, class). `ext` holds the batch's boxes as [N][5] (lo0, hi0, lo1, hi1, area), `order` their
// indices in StrOrder; `w` is the task's scratch (capacity N).
void SoftNmsOne(const float* ext, const int32_t* order, const float* scores, int64_t num_boxes, const Params& prm,
                const Isafns& fn, Work& w, std::vector<Pick>& out) {
  int64_t n = 0;
  for (int64_t j = 0; j < num_boxes; ++j)  // NaN is never >=: dropped
    w.rank[j] = scores[j] >= prm.score_threshold ? static_cast<int32_t>(n++) : -1;
  w.slots = 0;
  for (int64_t q = 0; q < num_boxes; ++q) {
    const int32_t j = order[q], p = w.rank[j];
    if (p < 0) continue;
    const float* e = ext + static_cast<int64_t>(j) * 5;
    const int64_t k = w.slots++;
    w.lo0[k] = e[0], w.hi0[k] = e[1], w.lo1[k] = e[2], w.hi1[k] = e[3], w.area[k] = e[4];
    w.pos[k] = p;
    w.box[k] = j;
    w.score[p] = scores[j];
    w.slot[p] = static_cast<int32_t>(k);
  }
  w.Blocks();
  const float thr = prm.score_threshold;
  const int64_t limit = prm.max_output > 0 ? std::min(prm.max_output, n) : n;
  for (int64_t i = 0; i < n && i < limit; ++i) {
    // the selection: the first position in [i, n) holding the largest score
    const int64_t m = fn.first_equal(w.score.data(), i, n, fn.max(w.score.data(), i, n));
    if (m != i) w.SwapPositions(i, m);
    const int32_t k = w.slot[i];
    out.push_back({w.box[k], w.score[i]});
    const Selected t{w.lo0[k], w.hi0[k], w.lo1[k], w.hi1[k], w.area[k]};
    w.Tombstone(k);
    const int64_t near_n = fn.scan(t, w, prm);
    fn.weigh(w, near_n, prm);
    const int64_t dead_n = ApplyWeights(w, near_n, thr);
    if (dead_n > 0) {
      // The original's removal, replayed: scanning up from i + 1, each dead position takes the last
      // working row, after the dead rows at the tail are dropped (a moved row is alive, so the next
      // dead position is the next one in ascending order that is still < n).
      int32_t* dead = w.dead.data();
      for (int64_t j = 0; j < dead_n; ++j) w.Tombstone(w.slot[dead[j]]);
      std::sort(dead, dead + dead_n);
      for (int64_t j = 0; j < dead_n && dead[j] < n; ++j) {
        const int64_t p = dead[j];
        while (n - 1 > p && !(w.score[n - 1] >= thr)) --n;
        if (n - 1 > p) w.MovePosition(n - 1, p);  // else the dead row is the last one and just goes
        --n;
      }
    }
    // Tombstones cost scan time; dropping them costs one pass over the slots: amortised O(1) each.
    if (w.tombs > 16 && 2 * w.tombs > w.slots) w.Compact();
  }
}

// Sorts keys = (order-preserving bits of a float) << 32 | index; LSD radix on the key bits from 1024 up.
void SortKeys(std::vector<uint64_t>& keys, std::vector<uint64_t>& tmp) {
  if (keys.size() < 1024) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  tmp.resize(keys.size());
  for (int shift = 32; shift < 64; shift += 11) {
    size_t count[2049] = {};
    for (uint64_t v : keys) ++count[((v >> shift) & 2047) + 1];
    for (int d = 0; d < 2048; ++d) count[d + 1] += count[d];
    for (uint64_t v : keys) tmp[count[(v >> shift) & 2047]++] = v;
    keys.swap(tmp);
  }
}

inline uint64_t Key(float v, int64_t j) {  // v is never NaN (see Extents)
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  u ^= (u >> 31) != 0 ? 0xFFFFFFFFu : 0x80000000u;
  return (static_cast<uint64_t>(u) << 32) | static_cast<uint32_t>(j);
}

// Box indices of one batch (ext as in SoftNmsOne) in the slots' order: sort-tile-recursive packing,
// i.e. sqrt(N/16) slices by lo0, each sorted by lo1, so that runs of 16 slots (one block) are compact
// in both coordinates and the blocks' boxes are small. (Any order is correct; this one is fast.)
void StrOrder(const float* ext, int64_t num_boxes, int32_t* order) {
  std::vector<uint64_t> keys(static_cast<size_t>(num_boxes)), tmp;
  for (int64_t j = 0; j < num_boxes; ++j) keys[j] = Key(ext[j * 5 + 0], j);
  SortKeys(keys, tmp);
  const int64_t slices = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(num_boxes) / kBlock)));
  const int64_t per_slice = (num_boxes + slices - 1) / slices;
  std::vector<uint64_t> slice;
  for (int64_t s0 = 0; s0 < num_boxes; s0 += per_slice) {
    const int64_t s1 = std::min(num_boxes, s0 + per_slice);
    slice.clear();
    for (int64_t q = s0; q < s1; ++q) {
      const int64_t j = static_cast<uint32_t>(keys[q]);
      slice.push_back(Key(ext[j * 5 + 2], j));
    }
    SortKeys(slice, tmp);
    for (int64_t q = s0; q < s1; ++q) order[q] = static_cast<int32_t>(slice[q - s0]);
  }
}

// Boxes of one batch -> [N][5] (lo0, hi0, lo1, hi1, area); a box with a NaN corner overlaps nothing.
template <class T>
void Extents(const T* boxes, int64_t num_boxes, bool center, float off, float* ext) {
  for (int64_t j = 0; j < num_boxes; ++j) {
    const float a0 = ToFloat(boxes[j * 4 + 0]), a1 = ToFloat(boxes[j * 4 + 1]);
    const float a2 = ToFloat(boxes[j * 4 + 2]), a3 = ToFloat(boxes[j * 4 + 3]);
    float p0 = a0, q0 = a2, p1 = a1, q1 = a3;
    if (center) {
      p0 = a0 - a2 * 0.5f, q0 = a0 + a2 * 0.5f, p1 = a1 - a3 * 0.5f, q1 = a1 + a3 * 0.5f;
    }
    float* e = ext + j * 5;
    if (std::isnan(p0) || std::isnan(q0) || std::isnan(p1) || std::isnan(q1)) {
      e[0] = kInf, e[1] = -kInf, e[2] = kInf, e[3] = -kInf;
    } else {
      e[0] = std::min(p0, q0), e[1] = std::max(p0, q0), e[2] = std::min(p1, q1), e[3] = std::max(p1, q1);
    }
    e[4] = ((e[1] - e[0]) + off) * ((e[3] - e[2]) + off);
  }
}

template <class T>
float ScalarOr(const Input<T>& in, float fallback) {
  return in.present ? ToFloat(in.data[0]) : fallback;
}

struct SoftNmsKernel {
  static constexpr const char* kName = kOp;
  static constexpr Port kInputs[] = {
      {Elem::kT}, {Elem::kT}, {Elem::kInt64, true}, {Elem::kFloat, true}, {Elem::kFloat, true}};
  static constexpr Port kOutputs[] = {{Elem::kInt64}, {Elem::kT}};

  std::string method;
  float sigma;
  int64_t center_point_box, coordinate_offset;
  Isa isa;

  explicit SoftNmsKernel(const Attrs& attrs)
      : method(attrs.String("method", "linear")),
        sigma(attrs.Float("sigma", 0.5f)),
        center_point_box(attrs.Int("center_point_box", 0)),
        coordinate_offset(attrs.Int("coordinate_offset", 0)),
        isa(SelectIsa()) {}

  // Same rules, order and words as validate() in softdeploy/ops/soft_nms.py.
  Method Validate(const std::vector<int64_t>& boxes, const std::vector<int64_t>& scores) const {
    Method m = Method::kLinear;
    if (method == "linear") m = Method::kLinear;
    else if (method == "gaussian") m = Method::kGaussian;
    else if (method == "hard") m = Method::kHard;
    else Fail(kOp, "method '", method, "' is not supported (rule: method is one of 'linear', 'gaussian', 'hard')");
    if (!(sigma > 0.0f)) Fail(kOp, "sigma ", sigma, " must be > 0 (rule: sigma > 0)");
    if (center_point_box != 0 && center_point_box != 1)
      Fail(kOp, "center_point_box ", center_point_box, " is not supported (rule: center_point_box is 0 or 1)");
    if (coordinate_offset != 0 && coordinate_offset != 1)
      Fail(kOp, "coordinate_offset ", coordinate_offset, " is not supported (rule: coordinate_offset is 0 or 1)");
    if (boxes.size() != 3 || boxes[2] != 4)
      Fail(kOp, "Boxes shape ", ShapeStr(boxes), " is not [B, N, 4] (rule: Boxes is [num_batches, num_boxes, 4])");
    if (scores.size() != 3)
      Fail(kOp, "Scores shape ", ShapeStr(scores),
           " is not [B, C, N] (rule: Scores is [num_batches, num_classes, num_boxes])");
    if (scores[0] != boxes[0] || scores[2] != boxes[1])
      Fail(kOp, "Scores shape ", ShapeStr(scores), " does not match Boxes shape ", ShapeStr(boxes),
           " (rule: Scores is [B, C, N] for Boxes [B, N, 4])");
    return m;
  }

  template <class T>
  void Compute(Ort::KernelContext& ctx) const {
    const Input<T> boxes = GetInput<T>(ctx, 0);
    const Input<T> scores = GetInput<T>(ctx, 1);
    const Input<int64_t> max_out = GetInput<int64_t>(ctx, 2);
    const Input<float> iou = GetInput<float>(ctx, 3);
    const Input<float> score_thr = GetInput<float>(ctx, 4);
    Params prm;
    prm.method = Validate(boxes.shape, scores.shape);
    const char* names[] = {"MaxOutputBoxesPerClass", "IouThreshold", "ScoreThreshold"};
    const std::vector<int64_t>* shapes[] = {&max_out.shape, &iou.shape, &score_thr.shape};
    const bool present[] = {max_out.present, iou.present, score_thr.present};
    for (int k = 0; k < 3; ++k) {
      if (present[k] && NumElements(*shapes[k]) != 1)
        Fail(kOp, names[k], " has shape ", ShapeStr(*shapes[k]), " (rule: the optional inputs hold one value each)");
    }
    prm.max_output = max_out.present ? max_out.data[0] : 0;
    prm.iou_threshold = ScalarOr(iou, 0.3f);
    prm.score_threshold = ScalarOr(score_thr, 0.001f);
    prm.sigma = sigma;
    prm.offset = static_cast<float>(coordinate_offset);
    prm.skip_disjoint = Weight(0.0f, prm) == 1.0f;

    const int64_t num_batches = boxes.shape[0], num_boxes = boxes.shape[1], num_classes = scores.shape[1];
    if (num_batches == 0 || num_boxes == 0 || num_classes == 0) {
      // Nothing to select. Return before any per-batch or per-pair work: Boxes [2^40, 0, 4] holds no
      // data, but visiting its 2^40 (batch, class) pairs took hours (and the picks table 2^40 vectors).
      AllocOutput<int64_t>(ctx, 0, {0, 3});
      AllocOutput<T>(ctx, 1, {0});
      return;
    }
    // rows are addressed as int32 in the SIMD passes (2^31 boxes would be 32 GiB of Boxes per batch)
    if (num_boxes > std::numeric_limits<int32_t>::max())
      Fail(kOp, "Boxes holds ", num_boxes, " boxes per batch (kernel limit: 2147483647)");
    std::vector<float> ext(static_cast<size_t>(num_batches * num_boxes * 5));
    std::vector<int32_t> order(static_cast<size_t>(num_batches * num_boxes));
    for (int64_t b = 0; b < num_batches; ++b) {
      Extents(boxes.data + b * num_boxes * 4, num_boxes, center_point_box == 1, prm.offset, &ext[b * num_boxes * 5]);
      StrOrder(&ext[b * num_boxes * 5], num_boxes, &order[b * num_boxes]);
    }

    Isafns fn{ScanPortable, WeighPortable, MaxPortable, FirstEqualPortable};
    if (isa == Isa::kAvx512) fn = {ScanAvx512, WeighAvx512, soft_nms::MaxAvx512, soft_nms::FirstEqualAvx512};
    else if (isa == Isa::kAvx2) fn = {ScanAvx2, WeighPortable, soft_nms::MaxAvx2, soft_nms::FirstEqualAvx2};
    if (!prm.skip_disjoint) fn.scan = ScanPortable;  // every live row, disjoint ones included
    const int64_t pairs = num_batches * num_classes;
    std::vector<std::vector<Pick>> picks(static_cast<size_t>(pairs));
    // Cost of one pair ~ N^2/2 IoUs in the worst case; NumTasks keeps tasks >= its grain.
    const size_t tasks = NumTasks(pairs, num_boxes * num_boxes / 2 + 1);
    ParallelFor(ctx, tasks, [&](size_t task) {
      int64_t p0, p1;
      TaskRange(task, tasks, pairs, &p0, &p1);
      Work work;
      work.Resize(static_cast<size_t>(num_boxes));
      std::vector<float> s32(static_cast<size_t>(num_boxes));
      for (int64_t pair = p0; pair < p1; ++pair) {
        const int64_t b = pair / num_classes;
        const T* s = scores.data + pair * num_boxes;
        for (int64_t j = 0; j < num_boxes; ++j) s32[j] = ToFloat(s[j]);
        SoftNmsOne(&ext[b * num_boxes * 5], &order[b * num_boxes], s32.data(), num_boxes, prm, fn, work, picks[pair]);
      }
    });

    int64_t total = 0;
    for (const auto& p : picks) total += static_cast<int64_t>(p.size());
    int64_t* out_rows = AllocOutput<int64_t>(ctx, 0, {total, 3});
    T* out_scores = AllocOutput<T>(ctx, 1, {total});
    int64_t k = 0;
    for (int64_t pair = 0; pair < pairs; ++pair) {
      for (const Pick& p : picks[pair]) {
        out_rows[k * 3 + 0] = pair / num_classes;
        out_rows[k * 3 + 1] = pair % num_classes;
        out_rows[k * 3 + 2] = p.index;
        out_scores[k] = FromFloat<T>(p.score);
        ++k;
      }
    }
  }
};

}  // namespace

SD_REGISTER_KERNEL(SoftNMS, SoftNmsKernel)

}  // namespace sd
