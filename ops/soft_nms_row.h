// SoftNMS's vector passes (ops/soft_nms_kernels.h over the vector traits, compiled in
// ops/soft_nms_avx2.cc and ops/soft_nms_avx512.cc with their own flags): their interface to
// ops/soft_nms.cc. Plain types only, no functions defined here (see ops/common/vec.h on why).
#pragma once

#include <cstdint>

namespace sd {
namespace soft_nms {

constexpr int64_t kBlock = 16;  // slots per bounding box (one AVX-512 vector, two AVX2 ones)

// The selected box, broadcast once per round.
struct Selected {
  float lo0, hi0, lo1, hi1, area;
};

// The slots of ops/soft_nms.cc's Work as pointers: `blocks` whole blocks of kBlock slots (tombstones:
// pos -1, hi0 -inf), each block's bounding box, and the near list (room for n + 16 entries, n the
// working rows: whole vectors are stored past its end).
struct Slots {
  const float *lo0, *hi0, *lo1, *hi1, *area;
  const int32_t* pos;
  const float *block_lo0, *block_hi0, *block_lo1, *block_hi1;
  int64_t blocks;
  float *near_inter, *near_union;
  int32_t* near_pos;
};

// The live slots that overlap t (IoU's iw > 0 and ih > 0), appended to the near list in slot order as
// intersection, union and position; returns the list's length. Only for weight(IoU 0) == 1.
int64_t ScanAvx2(const Selected& t, const Slots& w, float offset);
int64_t ScanAvx512(const Selected& t, const Slots& w, float offset);
// The largest of s[begin, end) (no NaN there); the first p in [begin, end) with s[p] == value, or end.
float MaxAvx2(const float* s, int64_t begin, int64_t end);
float MaxAvx512(const float* s, int64_t begin, int64_t end);
int64_t FirstEqualAvx2(const float* s, int64_t begin, int64_t end, float value);
int64_t FirstEqualAvx512(const float* s, int64_t begin, int64_t end, float value);
// The near rows' weights in place of their intersections, inter[j] = weight(inter[j] / uni[j]), as
// ops/soft_nms.cc's Weight (method: 0 linear, 1 gaussian, 2 hard). AVX-512 only.
void WeighAvx512(float* inter, const float* uni, int64_t near_n, int method, float iou_threshold, float sigma);

}  // namespace soft_nms
}  // namespace sd
