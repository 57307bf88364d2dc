// Softpick's vector row for AVX2: ops/softpick_kernels.h instantiated with the Avx2 traits. Compiled
// with the AVX2 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time ISA check
// of ops/softpick.cc.
#include "softpick_kernels.h"

namespace sd {
namespace softpick {

void RowAvx2(const float* x, float* y, int64_t n, float eps) { Row<vec::Avx2>(x, y, n, eps); }

}  // namespace softpick
}  // namespace sd
