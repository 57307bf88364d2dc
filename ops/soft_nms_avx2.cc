// SoftNMS's vector passes for AVX2: ops/soft_nms_kernels.h instantiated with the Avx2 traits. Compiled
// with the AVX2 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time ISA check
// of ops/soft_nms.cc.
#include "soft_nms_kernels.h"

namespace sd {
namespace soft_nms {

int64_t ScanAvx2(const Selected& t, const Slots& w, float offset) { return Scan<vec::Avx2>(t, w, offset); }
float MaxAvx2(const float* s, int64_t begin, int64_t end) { return Max<vec::Avx2>(s, begin, end); }
int64_t FirstEqualAvx2(const float* s, int64_t begin, int64_t end, float value) {
  return FirstEqual<vec::Avx2>(s, begin, end, value);
}

}  // namespace soft_nms
}  // namespace sd
