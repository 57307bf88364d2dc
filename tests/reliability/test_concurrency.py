"""Concurrency: 8 Python threads share ONE Session per op, at 1 and 2 intra-op threads, on the op's
smallest typical sample (8 x 1000 runs) and on a shape whose work the kernel splits into several tasks
(8 x 125 runs); every result must be bit-identical to a serial run (onnxruntime's Run is documented
thread-safe; the kernels keep no per-call state in the op).

The shape is grown from the op's smallest typical sample until ops/common/kernel.h's NumTasks gives at
least two tasks (the grain is 65536 units per task): ``expected_tasks`` mirrors each NumTasks call
site, and an op it does not model fails the test (add its model) rather than running unsplit.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest

from reliability.checks import run_kernel
from reliability.fuzzing import dim_groups, redraw
from softdeploy.ops import REGISTRY, OpDef, Sample

THREADS = 8
# Runs per thread: 1000 on the op's smallest typical sample; on the shape that splits into tasks (up to
# ~0.15 M elements: ~1 ms per run in the portable variant), 1000 in all, so that SOFTDEPLOY_ISA=portable
# runs stay within the suite's time budget too.
RUNS = {"small": 1000, "splitting": 1000 // THREADS}
GRAIN, MAX_TASKS = 65536, 256


def num_tasks(rows: int, row_cost: int) -> int:
    """ops/common/kernel.h NumTasks."""
    if rows <= 1:
        return 0 if rows < 1 else 1
    return min(rows, max(1, rows * max(row_cost, 1) // GRAIN), MAX_TASKS)


def expected_tasks(op: OpDef, sample: Sample) -> int:
    """The task count of the op's kernel for this sample (mirrors the NumTasks call sites)."""
    ports = {p.name: v for p, v in zip(op.inputs, sample.inputs, strict=False)}
    if "Boxes" in ports:  # ops/soft_nms.cc: one (batch, class) pair per unit of work, ~N^2/2 IoUs each
        b, c, n = np.shape(ports["Scores"])
        return num_tasks(b * c, n * n // 2 + 1)
    if "Q" in ports and "D" in ports:  # ops/max_sim_core.h: documents split, cost B*Lq*Ld*dim each
        b, lq, dim = np.shape(ports["Q"])
        n, ld, _ = np.shape(ports["D"])
        return num_tasks(n, b * lq * ld * max(dim, 1))
    if {"A", "Bm", "Router"} <= set(ports):  # ops/lora_mixer.cc: fixed blocks of 64 tokens (not NumTasks)
        x = np.asarray(ports["X"])
        return -(-math.prod(x.shape[:-1]) // 64)
    if set(ports) <= {"X", "Ranges", "Ts", "Mask"}:  # MapRows / rows of the axis (MultiMax costs 4n: >= n)
        x = np.asarray(ports["X"])
        axis = sample.attrs.get("axis", -1) % x.ndim
        n = x.shape[axis]
        return num_tasks(x.size // max(n, 1), n)
    if "Landmarks" in ports:  # ops/nystrom_gaussian_attention.cc: one task per (batch, head)
        b, h = np.shape(ports["Q"])[:2]
        return b * h
    if {"A", "B", "BScale"} <= set(ports):  # ops/rowwise_int8_matmul.cc: 16-column panels, M * kp * 16 / 32 each
        m = math.prod(np.shape(ports["A"])[:-1])
        k, n = np.shape(ports["B"])
        return 0 if m == 0 or n == 0 else num_tasks(-(-n // 16), m * (-(-k // 16) * 16) * 16 // 32)
    if set(ports) in (
        {"Q", "K", "V"},
        {"Q", "K", "V", "Mask"},
    ):  # ops/softpick_attention.cc: (batch, head, 48-query block)
        b, h, tq = np.shape(ports["Q"])[:3]
        return b * h * -(-tq // 48)
    if {"Logits", "Embedding"} <= set(ports):  # ops/soft_token_embedding.cc: rows of Logits, cost V each
        b, v = np.shape(ports["Logits"])
        return num_tasks(b, v)
    raise AssertionError(f"{op.name}: no task model here; add its NumTasks call site to expected_tasks()")


def _int8_tokens(op: OpDef, sample: Sample) -> bool:
    """Whether the sample's "T" inputs are int8 (MaxSim's int8 samples): the float32 runs here skip those. Ports
    that are int8 by contract (RowwiseInt8MatMul's B) do not count."""
    return any(
        p.dtype == "T" and v is not None and np.asarray(v).dtype == np.int8
        for p, v in zip(op.inputs, sample.inputs, strict=False)
    )


def small_sample(op: OpDef) -> Sample:
    """The op's typical float32 sample with the fewest elements."""
    typical = [s for s in op.samples(np.random.default_rng(0)) if s.kind == "typical" and not _int8_tokens(op, s)]
    return min(typical, key=lambda s: sum(np.size(v) for v in s.inputs if v is not None))


def splitting_sample(op: OpDef) -> Sample:
    """The op's typical float32 sample with the fewest elements once its largest dim group is doubled
    until the kernel splits it into >= 2 tasks (values re-drawn from the sample's own)."""
    best: tuple[int, Sample] | None = None
    for s in op.samples(np.random.default_rng(0)):
        if s.kind != "typical" or _int8_tokens(op, s):
            continue
        sizes = {g: g for g in dim_groups(s)}
        rng = np.random.default_rng(1)
        while True:
            shapes = [None if v is None else tuple(sizes[d] for d in np.shape(v)) for v in s.inputs]
            if sum(math.prod(sh) for sh in shapes if sh is not None) > 1 << 21:
                break  # this sample does not split at a small shape (e.g. one (batch, class) pair of SoftNMS)
            inputs = tuple(
                None if v is None else (np.asarray(v) if sh == np.shape(v) else redraw(v, sh, np.asarray(v).dtype, rng))
                for v, sh in zip(s.inputs, shapes, strict=True)
            )
            grown = Sample(f"{s.name}_grown{list(shapes[0] or [])}", inputs, s.attrs, s.kind)
            if expected_tasks(op, grown) >= 2:
                elements = sum(math.prod(sh) for sh in shapes if sh is not None)
                if best is None or elements < best[0]:
                    best = (elements, grown)
                break
            big = max(g for g in sizes if g > 0)
            sizes[big] *= 2
    assert best is not None, f"{op.name}: no typical sample grows into a shape that splits"
    return best[1]


@pytest.fixture(autouse=True, scope="module")
def _quiet_onnxruntime():
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)


@pytest.mark.parametrize("shape", ["small", "splitting"])
@pytest.mark.parametrize("intra_threads", [1, 2])
@pytest.mark.parametrize("name", list(REGISTRY))
def test_eight_threads_share_one_session_bit_identically(name, intra_threads, shape, capsys):
    from softdeploy.runtime import Session

    op = REGISTRY[name]
    sample = small_sample(op) if shape == "small" else splitting_sample(op)
    tasks = expected_tasks(op, sample)
    assert shape == "small" or tasks >= 2
    runs = RUNS[shape]
    # isa None: the variant the session below gets too (SOFTDEPLOY_ISA, when set, or the best one)
    serial = run_kernel(op, sample, None, threads=1)
    assert isinstance(serial, tuple), serial
    want = [np.ascontiguousarray(a).tobytes() for a in serial]
    session = Session(op.make_model(sample, with_function=False), kernels="native", threads=intra_threads)
    feeds = op.feeds(sample)
    mismatches: list[str] = []
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(t: int) -> None:
        try:
            start.wait()
            for i in range(runs):
                got = session.run(feeds)
                if [np.ascontiguousarray(a).tobytes() for a in got] != want:
                    mismatches.append(f"thread {t} run {i}")
        except BaseException as e:  # reported below: a worker must not die silently
            errors.append(e)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    shapes = [list(np.shape(v)) for v in sample.inputs if v is not None]
    with capsys.disabled():
        print(
            f"\nconcurrency {name}: {THREADS} threads x {runs} runs, intra-op threads {intra_threads}, inputs {shapes}, "
            f"{tasks} tasks: {len(mismatches)} mismatches, {len(errors)} errors, {seconds:.1f} s"
        )
    assert not errors, errors[:3]
    assert not mismatches, f"{len(mismatches)} of {THREADS * runs} results differ from the serial run: {mismatches[:5]}"
