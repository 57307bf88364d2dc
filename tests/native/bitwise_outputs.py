"""Digests of every native kernel's outputs, bit for bit, for comparing two builds of the library
(.ci/clang: GCC's and clang's). Run once per library:

    SOFTDEPLOY_LIBRARY=build/libsoftdeploy_ops.so PYTHONPATH=. python tests/native/bitwise_outputs.py gcc.json
    SOFTDEPLOY_LIBRARY=build-clang/libsoftdeploy_ops.so PYTHONPATH=. python tests/native/bitwise_outputs.py clang.json
    python tests/native/bitwise_outputs.py --diff gcc.json clang.json

Two builds of different sources (a kernel moved onto the vector traits must give its former results):
``--ops A,B`` restricts both the digests and the diff to those ops, ``--large`` adds the larger random
inputs of LARGE (sizes past the kernels' blocks and tiles, which the samples keep small).

Inputs: each op's own samples (typical, edge and special) over several seeds, and the same shapes
refilled with random values where a fraction of the entries are specials (NaN, +-inf, +-0, the
largest finite, subnormals, ties), in float32 and, where the op has it, float16; every kernel variant
the CPU runs (SOFTDEPLOY_ISA). A case the kernel refuses is recorded by its error message, so the
two builds must refuse the same cases. Integer inputs (int8 MaxSim, SoftNMS's boxes' order) keep the
sample's values. Digest: sha256 of each output's dtype, shape and bytes (see _digest for NaNs).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from softdeploy.ops._schema import OpDef, Sample

SEEDS = 6  # samples(rng) per op per seed; with the refills: a few hundred cases per op and variant
REFILLS = 4  # random refills (with specials) of each sample
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4028235e38, -3.4028235e38, 1e-45, -1e-40, 1.0, 1.0])


def _refill(value: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A float array of the same shape and dtype: normal values (scale 1 or 30), ~6% specials."""
    scale = rng.choice([1.0, 30.0])
    out = rng.standard_normal(value.shape) * scale
    hit = rng.random(value.shape) < 0.06
    out[hit] = rng.choice(SPECIALS, size=int(hit.sum()))
    with np.errstate(over="ignore"):
        return out.astype(value.dtype)


def _cases(op: OpDef, seed: int) -> Iterator[Sample]:
    from softdeploy.conformance import cast_sample

    rng = np.random.default_rng(seed)
    for sample in op.samples(rng):
        for dtype in op.float_types:
            cast = cast_sample(op, sample, dtype)
            if cast is None:
                continue
            yield cast
            for r in range(REFILLS):
                inputs: list[np.ndarray | None] = []
                for port, value in zip(op.inputs, cast.inputs, strict=False):
                    if value is not None and port.dtype == "T" and np.issubdtype(np.asarray(value).dtype, np.floating):
                        value = _refill(np.asarray(value), rng)
                    inputs.append(value)
                yield Sample(f"{cast.name}~{r}", tuple(inputs), cast.attrs, "special")


def _large_cases(op: OpDef, seed: int) -> Iterator[Sample]:
    """LARGE's inputs for ``op`` (none for the other ops), drawn from ``seed``."""
    make = LARGE.get(op.name)
    if make is not None:
        yield from make(np.random.default_rng(1000 + seed))


def _softpick_attention_large(rng: np.random.Generator) -> Iterator[Sample]:
    def t(*shape: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    q, k, v = t(1, 2, 300, 64), t(1, 2, 700, 64), t(1, 2, 700, 64)
    yield Sample("large_none", (q, k, v, None))
    yield Sample("large_causal", (q, k, v, None), {"causal": 1})
    pad = np.zeros((1, 1, 1, 700), np.float32)
    pad[..., 500:] = -np.inf
    yield Sample("large_padding", (q, k, v, pad))
    yield Sample("large_full_mask", (q, k, v, t(1, 2, 300, 700, s=3.0)))
    yield Sample("large_scores_rescale", (t(1, 2, 100, 64, s=3.0), t(1, 2, 400, 64, s=3.0), t(1, 2, 400, 48)))
    yield Sample("large_grouped_causal", (t(1, 4, 97, 32), t(1, 2, 260, 32), t(1, 2, 260, 40)), {"causal": 1})


def _nystrom_large(rng: np.random.Generator) -> Iterator[Sample]:
    def t(*shape: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    yield Sample("large_n700", (t(1, 2, 700, 64, s=0.5), t(1, 2, 700, 64), t(1, 2, 32, 64, s=0.5)))
    yield Sample("large_odd", (t(2, 1, 333, 37), t(2, 1, 333, 19), t(2, 1, 23, 37)), {"newton_iters": 7})


def _lora_mixer_large(rng: np.random.Generator) -> Iterator[Sample]:
    def t(*shape: int, s: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * s).astype(np.float32)

    yield Sample("large_e8_r8", (t(3, 50, 200), t(8, 8, 200, s=0.1), t(8, 136, 8, s=0.1), t(8, 200)), {"top_k": 2})
    yield Sample("large_e13_r5", (t(151, 77), t(13, 5, 77, s=0.1), t(13, 45, 5, s=0.1), t(13, 77)), {"top_k": 3})


# Larger inputs per op (--large): what a kernel moved between code layers must reproduce beyond the samples.
LARGE = {
    "SoftpickAttention": _softpick_attention_large,
    "NystromGaussianAttention": _nystrom_large,
    "LoRAMixer": _lora_mixer_large,
}


def _digest(outputs: Sequence[np.ndarray]) -> list[str]:
    """Per output: the digest with every NaN as one quiet NaN, then ':' and the digest of the raw bytes.
    No op promises a NaN's sign or payload (x86 keeps the first operand's NaN, so a compiler's choice
    of operand order for a commutative add or max picks it): those count as equal, and are reported
    apart from value differences."""
    out = []
    for o in outputs:
        a = np.ascontiguousarray(o)
        digests = []
        for b in (np.where(np.isnan(a), np.array(np.nan, a.dtype), a) if a.dtype.kind == "f" else a, a):
            h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
            h.update(np.ascontiguousarray(b).tobytes())
            digests.append(h.hexdigest()[:24])
        out.append(":".join(digests))
    return out


def _values(d: Any) -> Any:
    """The NaN-canonical part of a case's record (an error message stays as it is)."""
    return d if isinstance(d, str) or d is None else [x.split(":")[0] for x in d]


def collect(ops: Sequence[str] | None = None, large: bool = False) -> dict[str, Any]:
    """{op: {variant: {case key: digests or 'error: ...'}}} for this process's library (``ops``: only those;
    ``large``: LARGE's inputs too)."""
    from softdeploy import conformance
    from softdeploy.ops import REGISTRY
    from softdeploy.runtime.library import library_info

    info = library_info()
    result: dict[str, Any] = {"library": str(info.path), "compiler": info.compiler, "ops": {}}
    for name in sorted(REGISTRY):
        op = REGISTRY[name]
        if name not in info.ops or (ops is not None and name not in ops):
            continue
        per_isa: dict[str, dict[str, Any]] = {}
        for isa in conformance.available_isas():
            got: dict[str, Any] = {}
            for seed in range(SEEDS):
                cases = itertools.chain(_cases(op, seed), _large_cases(op, seed) if large else ())
                for i, sample in enumerate(cases):
                    key = f"{seed}/{i}/{sample.name}"
                    try:
                        got[key] = _digest(conformance.run(op, sample, "kernel", isa=isa))
                    except Exception as e:  # a refused case: the message is compared
                        got[key] = f"error: {type(e).__name__}: {str(e)[:300]}"
            per_isa[isa] = got
        result["ops"][name] = per_isa
    return result


def diff(a: dict[str, Any], b: dict[str, Any], ops: Sequence[str] | None = None) -> int:
    """Prints per op and variant how many cases agree (``ops``: only those); returns the number that differ."""
    bad = 0
    for op in sorted(set(a["ops"]) | set(b["ops"])):
        if ops is not None and op not in ops:
            continue
        for isa in sorted(set(a["ops"].get(op, {})) | set(b["ops"].get(op, {}))):
            x, y = a["ops"].get(op, {}).get(isa, {}), b["ops"].get(op, {}).get(isa, {})
            keys = sorted(set(x) | set(y))
            differ = [k for k in keys if _values(x.get(k)) != _values(y.get(k))]
            nan_bits = sum(_values(x.get(k)) == _values(y.get(k)) and x.get(k) != y.get(k) for k in keys)
            errors = sum(isinstance(x.get(k), str) for k in keys)
            print(
                f"{op:28s} {isa:9s} {len(keys) - len(differ):5d}/{len(keys)} identical ({errors} refused; "
                f"{nan_bits} differ only in a NaN's sign or payload)"
            )
            for k in differ[:5]:
                print(f"    differs: {k}: {x.get(k)} vs {y.get(k)}")
            bad += len(differ)
    return bad


def main() -> int:
    """Writes this library's digests, or with --diff compares two files (exit 1 when any case differs)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two digest files")
    parser.add_argument("--ops", help="comma-separated op names: only these (default: every op)")
    parser.add_argument("--large", action="store_true", help="add the larger random inputs of LARGE")
    parser.add_argument("out", nargs="?", help="where to write this library's digests (JSON)")
    args = parser.parse_args()
    ops = None if args.ops is None else args.ops.split(",")
    if args.diff:
        with open(args.diff[0]) as fa, open(args.diff[1]) as fb:
            a, b = json.load(fa), json.load(fb)
        print(f"A: {a['library']}\nB: {b['library']}")
        bad = diff(a, b, ops)
        print(f"bitwise_outputs: {bad} cases differ")
        return 1 if bad else 0
    if not args.out:
        parser.error("give an output file, or --diff A B")
    result = collect(ops, args.large)
    with open(args.out, "w") as f:
        json.dump(result, f)
    n = sum(len(c) for per in result["ops"].values() for c in per.values())
    print(f"bitwise_outputs: {n} cases of {len(result['ops'])} ops from {result['library']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
