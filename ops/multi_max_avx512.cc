// MultiMax's vector row for AVX-512: ops/multi_max_kernels.h instantiated with the Avx512 traits. Compiled
// with the AVX-512 flags and -ffp-contract=off (CMakeLists.txt); called only after the run-time ISA check
// of ops/multi_max.cc.
#include "multi_max_kernels.h"

namespace sd {
namespace multi_max {

void RowAvx512(const RowArgs& a, const SigmaParams& p) { Row<vec::Avx512>(a, p); }

}  // namespace multi_max
}  // namespace sd
