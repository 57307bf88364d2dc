"""The GPU benchmark: ``python -m bench.gpu.bench_gpu`` from the repository root (bench/README.md)."""
