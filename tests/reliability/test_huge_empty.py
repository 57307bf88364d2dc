"""Huge-but-empty inputs: 2**40 rows of nothing (e.g. X [2**40, 0], Boxes [2**40, 0, 4]) must cost
nothing -- the kernel on every ISA returns the empty result at once (or refuses clearly), never loops
over the huge extent, never allocates for it, never crashes.

Variants come from each op's own samples with an empty input: one dim group of the sample (dims of
equal size, see fuzzing.dim_groups) at a time is set to 2**40 where every input holding it stays
empty and the outputs stay empty too. The kernels run in a child process per op, each variant under
a deadline, so that a hang is a failure of that variant (the child is killed and the rest go on).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reliability.fuzzing import HUGE, dim_groups, templates
from softdeploy import OpContractError
from softdeploy.ops import REGISTRY, Sample

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 10.0  # per variant, all ISAs: the empty result takes milliseconds


@dataclasses.dataclass(frozen=True)
class Variant:
    op: str
    name: str
    sample: Sample
    output_shapes: tuple[tuple[int, ...], ...]  # expected, all empty: the sample's with the dim at 2**40
    # the sample's own output shapes: a dim that only happens to equal the grown one (SoftNMS's
    # SelectedIndices [M, 3] with C = 3) may keep its size
    original_shapes: tuple[tuple[int, ...], ...]
    template: Sample  # its one-node model serves (symbolic dims; make_model would run the reference on 2**40)


def _variants(name: str) -> list[Variant]:
    op = REGISTRY[name]
    out: list[Variant] = []
    for t in templates(name):
        shapes = [None if v is None else np.shape(v) for v in t.inputs]
        if not any(s is not None and 0 in s for s in shapes):
            continue
        try:
            want = op.reference(*t.inputs, **t.attrs)
        except OpContractError:
            continue
        for g in dim_groups(t):
            if g == 0:
                continue
            new = [None if s is None else tuple(HUGE if d == g else d for d in s) for s in shapes]
            if any(s is not None and g in old and 0 not in old for s, old in zip(new, shapes, strict=True)):
                continue  # an input holding this dim would be huge and non-empty
            outs = tuple(tuple(HUGE if d == g else d for d in np.shape(w)) for w in want)
            if any(math.prod(o) != 0 for o in outs):
                continue  # the result would not be empty
            try:
                inputs = tuple(
                    None if v is None else (np.zeros(s, np.asarray(v).dtype) if s != np.shape(v) else np.asarray(v))
                    for v, s in zip(t.inputs, new, strict=True)
                )
            except ValueError:  # numpy refuses shapes whose non-zero dims multiply past 2^63 (2^40 x 0 x 2^40)
                continue
            label = f"{name}-{t.name}-dim{g}-2^40"
            originals = tuple(tuple(np.shape(w)) for w in want)
            out.append(Variant(name, label, Sample(label, inputs, t.attrs, t.kind), outs, originals, t))
    return out


VARIANTS = [v for name in REGISTRY for v in _variants(name)]

_CHILD = r"""
import json, sys, numpy as np, onnxruntime
onnxruntime.set_default_logger_severity(4)
from softdeploy import SoftdeployError, conformance
from softdeploy.runtime import Session
folder, isas = sys.argv[1], sys.argv[2].split(",")
for line in sys.stdin:
    vid = line.strip()
    result = {"id": vid, "isas": {}}
    with np.load(f"{folder}/{vid}.npz", allow_pickle=False) as z:
        feeds = {k: z[k] for k in z.files}
    for isa in isas:
        try:
            with conformance.forced_isa(isa):
                s = Session(f"{folder}/{vid}.onnx", kernels="native")
            outs = s.run(feeds)
            result["isas"][isa] = {"shapes": [list(o.shape) for o in outs], "dtypes": [o.dtype.name for o in outs]}
        except SoftdeployError as e:
            result["isas"][isa] = {"error": type(e).__name__, "message": str(e)}
    print(json.dumps(result), flush=True)
"""


@functools.cache
def _results(name: str, folder: str) -> dict[str, dict]:
    """Runs every variant of op ``name`` in child processes; a variant that misses DEADLINE_S is
    recorded as hung, its child killed, and the remaining variants go to a fresh child."""
    from softdeploy import conformance

    pending = [v.name for v in VARIANTS if v.op == name]
    results: dict[str, dict] = {}
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    while pending:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, folder, ",".join(conformance.available_isas())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("".join(f"{v}\n" for v in pending))
        child.stdin.close()
        deadline = time.monotonic() + DEADLINE_S + 10  # + the child's imports
        while pending:
            ready, _, _ = select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = child.stdout.readline() if ready else ""
            if not line:  # the deadline passed, or the child died
                vid = pending.pop(0)
                rc = child.poll()
                results[vid] = {"hung" if rc is None else "died": True, "rc": rc}
                child.kill()
                child.wait()
                break
            got = json.loads(line)
            results[got["id"]] = got
            pending.remove(got["id"])
            deadline = time.monotonic() + DEADLINE_S
        else:
            child.wait()
    return results


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("huge_empty")
    for v in VARIANTS:
        op = REGISTRY[v.op]
        (d / f"{v.name}.onnx").write_bytes(op.make_model(v.template, with_function=False).SerializeToString())
        np.savez(d / f"{v.name}.npz", **op.feeds(v.sample))
    return str(d)


def _marks(v: Variant) -> list:
    return []  # none known: SoftNMS's loop over (batch, class) pairs of an empty input is gone


def test_every_op_has_huge_empty_variants():
    assert {v.op for v in VARIANTS} == set(REGISTRY), "an op has no sample with an empty input to grow"


@pytest.mark.parametrize("variant", [pytest.param(v, marks=_marks(v), id=v.name) for v in VARIANTS])
def test_huge_but_empty_input_returns_at_once(variant, folder):
    got = _results(variant.op, folder)[variant.name]
    assert not got.get("hung"), f"{variant.op} {variant.name}: no result within {DEADLINE_S} s (loops over 2^40?)"
    assert not got.get("died"), f"{variant.op} {variant.name}: the process died (exit {got.get('rc')})"
    for isa, r in got["isas"].items():
        if "error" in r:
            # Refusing is allowed only as a clear contract error naming the op (e.g. an output too large).
            assert r["error"] == "OpContractError" and r["message"].startswith(f"{variant.op}: "), (isa, r)
            continue
        for got_shape, want, orig in zip(r["shapes"], variant.output_shapes, variant.original_shapes, strict=False):
            ok = len(got_shape) == len(want) and all(d in (w, o) for d, w, o in zip(got_shape, want, orig, strict=True))
            assert ok and math.prod(got_shape) == 0, (isa, r["shapes"], variant.output_shapes)
