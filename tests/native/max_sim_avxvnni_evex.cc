// ops/max_sim_avxvnni.cc compiled a second time for the size sweep only, with vpdpbusd's EVEX encoding of the same
// operation (ops/common/avxvnni.h): TileI8AvxVnniEvex runs on CPUs with AVX-512 VNNI + VL, which have no AVX-VNNI
// (Zen 4) or have both, so the AVX-VNNI tile's logic is swept there. Compiled with AVX-512 VNNI flags (CMakeLists.txt);
// never part of the library.
#define SD_AVXVNNI_AS_EVEX 1
#include "avxvnni_evex.h"  // the declaration the definition below must match
#include "max_sim_avxvnni.cc"  // NOLINT(bugprone-suspicious-include): the same source, another encoding
