#!/usr/bin/env bash
# The one prepared GPU check for issue 17 (docs/guide/gpu.md): on a machine with an NVIDIA GPU (an H200
# lent through the device tool), nvcc 13, torch with CUDA and CuPy, but only the CPU onnxruntime wheel:
#   1. builds the kernel library with SOFTDEPLOY_CUDA=ON (sm_80 + sm_90) into build-gpu/,
#   2. runs the CUDA driver tests (tests/ops/test_cuda.py: every sample of SoftmaxTopK, TwoPassSoftmax,
#      Softpick and MaxSim vs the float64 references, through the C ABI on device buffers),
#   3. runs the benchmark (bench/gpu/bench_gpu.py: copy bandwidth and bf16 matmul peak measured in the
#      same run, torch peers, the issue's floors),
# and writes tests.txt, bench.md and env.txt under $OUT (or bench/gpu/out/ when $OUT is unset). A few
# minutes in all; `bash bench/gpu/run_h200.sh` from the repository root.
#
# What of the onnxruntime CUDAExecutionProvider path cannot run there: everything that needs the
# onnxruntime-gpu wheel (~250 MB, larger than a device call can carry) -- sessions on the CUDA EP, and
# with them our CUDA-EP custom ops' registration, compute-stream and workspace-allocator use
# (ops/cuda/ort_cuda.cc). Those are compiled and linked here and registered in every session (a CPU
# session ignores them, which the CPU tests cover), but not executed on a GPU. The kernels they launch are
# the same launch functions the C ABI calls, which this script does test.
#
# Python side: softdeploy's base dependencies must import there (numpy, onnx, onnxscript, onnxruntime CPU;
# the ops registry and the references need them) -- env.txt records which do.
# Needs onnxruntime's C/C++ headers for the build and has no network: set ONNXRUNTIME_INCLUDE_DIR, or
# copy the headers to .ort-headers/ in the tree beforehand and carry that path (e.g.
#   cp -r ~/.cache/softdeploy/onnxruntime-headers-*/usr/include/onnxruntime .ort-headers).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR="${OUT:-bench/gpu/out}"
mkdir -p "$OUT_DIR"
if [[ -z "${ONNXRUNTIME_INCLUDE_DIR:-}" && -f .ort-headers/onnxruntime_c_api.h ]]; then
  export ONNXRUNTIME_INCLUDE_DIR="$PWD/.ort-headers"
fi
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv || true
  nvcc --version | tail -2
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" || true
  python -c "import cupy; print('cupy', cupy.__version__)" || true
  python -c "import onnxruntime; print('onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())" || true
  python -c "import numpy, onnx, onnxscript; print('numpy', numpy.__version__, 'onnx', onnx.__version__, 'onnxscript', onnxscript.__version__)" || true
} > "$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

BUILD_LOG="$OUT_DIR/build.txt"
start=$(date +%s)
if ! { cmake -S . -B build-gpu -G Ninja -DSOFTDEPLOY_CUDA=ON && cmake --build build-gpu -j "$(nproc)"; } > "$BUILD_LOG" 2>&1; then
  tail -40 "$BUILD_LOG"
  echo "build failed (full log: $BUILD_LOG)"
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s" | tee -a "$BUILD_LOG"
export SOFTDEPLOY_LIBRARY="$PWD/build-gpu/libsoftdeploy_ops.so"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# The tests fail (not skip) here if the device is invisible: this script exists to run them on one.
python - <<'PY'
from softdeploy.runtime.cuda import CudaKernels
k = CudaKernels.load()
n = k.device_count()
print("library:", k.info.cuda_summary(), "| devices:", n)
raise SystemExit(0 if n > 0 else "no CUDA device visible to the library's runtime")
PY
set +e
timeout 300 python -m pytest -q -rs -p no:cacheprovider tests/ops/test_cuda.py 2>&1 | tee "$OUT_DIR/tests.txt"
tests_rc=${PIPESTATUS[0]}
timeout 300 python -m bench.gpu.bench_gpu --out "$OUT_DIR/bench.md" 2>&1 | tee "$OUT_DIR/bench.txt"
bench_rc=${PIPESTATUS[0]}
set -e
echo "tests rc=$tests_rc bench rc=$bench_rc" | tee "$OUT_DIR/status.txt"
exit $(( tests_rc != 0 || bench_rc != 0 ))
