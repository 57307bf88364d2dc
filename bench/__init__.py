"""softdeploy's benchmarks, run as modules from the repository root: ``python -m bench.NAME [--threads 1,2]
[--quick]`` (bench/README.md). Each prints markdown; results are committed under bench/results.

Importing the package sets the thread pools' idle policy before any script loads numpy, torch or onnxruntime:
several runtimes share one process (torch/OpenMP, onnxruntime's pool, OpenBLAS, TVM), and with their default idle
spinning the workers of the runtime that ran last keep a core busy while the next one runs (on a 2-core machine
that made 2-thread timings of interleaved peers up to 4x worse than alone: onnxruntime MatMul 512^3 1.4 ms alone,
5.6 ms interleaved with torch.mm). So spinning is off unless ``PERF_SPIN=1``: OMP_WAIT_POLICY=PASSIVE, OpenBLAS
threads sleep at once, TVM's pool does not spin; bench.harness.ort_session turns off onnxruntime's.
"""

from __future__ import annotations

import os

SPIN = os.environ.get("PERF_SPIN", "0") == "1"
if not SPIN:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")  # TVM's workers spin 300000 rounds by default
