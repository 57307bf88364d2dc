"""How accurate is all-MiniLM-L6-v2 in the int8 formats a faster GEMM without VNNI would need? Measured, not guessed.

Why (issue 13, bench/results/minilm_int8_options.md): on an AVX2 CPU without VNNI onnxruntime's u8s8 GEMM takes
``vpmaddubsw`` + ``vpmaddwd`` per 32 products (2 multiply uops), which holds MiniLM int8 at 1.59x fp32 against the
floor's 1.8x. MaxSim's paired form (bench/results/maxsim.md) adds two ``vpmaddubsw`` results in int16 before one
``vpmaddwd``: 64 products per 3 multiply uops, measured 1.42-1.49x onnxruntime's u8s8 on MaxSim. It is exact only
when the int16 sum of FOUR products cannot saturate, i.e. for every such set of four weights of a column
``max(sum of its positive q, sum of its |negative q|) x max a <= 32767``; adding four vpmaddubsw results (the
"octet" form, 128 products per 5 multiply-port uops) needs the same of eight. This script measures, on the
case's data (653 queries, 871 documents, MaxSim scoring), what that costs in accuracy for the formats that satisfy
it, next to the formats onnxruntime runs today:

  activations  per-tensor (onnxruntime's DynamicQuantizeLinear: one asymmetric uint8 range per call, 0 included)
               or per-row (one range per token), on 0..255 (u8) or 0..127 (u7)
  weights      symmetric per output channel: 8-bit (|q| <= 127), 7-bit (|q| <= 64, onnxruntime's reduce_range),
               pair-bounded (same-sign even pairs sum <= 128: softdeploy.quant.pair_bounded, exact on vpmaddubsw
               with u8), or lane-bounded: the sets of weights that one int16 lane of the GEMM sums (4 of them in
               the paired form, 8 in the octet form that adds four vpmaddubsw results; the grouping of
               bench/micro/int8_gemm_paired.h) sum, per sign, to at most 32767 // L (L = 255 or 127, the
               activations' top); the step is max(max |w| / 127, largest same-sign set sum / (32767 // L - G)),
               G below the bound so that rounding cannot cross it

Every one of the 36 weight MatMuls (Q, K, V, attention output, FFN up and down) is fake-quantized in torch:
``linear(dequant(quant(x)), dequant(quant(W)), b)``. The integer products of these formats are exact in int32, so
the float computation differs from the integer kernel's only by float32 rounding (~1e-7 relative). Reference:
the same torch model in fp32. The first row reproduces onnxruntime's dynamic int8 (per-tensor u8, 8-bit weights:
sentence cosine 0.99133 there) as a check of the emulation.

    python -m bench.minilm_int8_paired_accuracy [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from bench import harness
from softdeploy.compare.metrics import cosine_rows
from softdeploy.compare.progress import SilentProgress
from softdeploy.models import get_case
from softdeploy.quant.pair_bounded import pair_bounded_int8


def quant_activation(x: torch.Tensor, levels: int, per_row: bool) -> torch.Tensor:
    """DynamicQuantizeLinear's rule (range widened to hold 0, scale = range / levels, zero point rounded and
    saturated, round half to even), over the whole tensor or per row of the last axis; returns the dequantized x."""
    x64 = x.double()
    if per_row:
        lo = x64.amin(dim=-1, keepdim=True).clamp(max=0.0)
        hi = x64.amax(dim=-1, keepdim=True).clamp(min=0.0)
    else:
        lo, hi = x64.min().clamp(max=0.0), x64.max().clamp(min=0.0)
    scale = (hi - lo) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zp = torch.round(-lo / scale).clamp(0, levels)
    q = torch.clamp(torch.round(x64 / scale) + zp, 0, levels)
    return ((q - zp) * scale).to(x.dtype)


def lane_group_sums(w: np.ndarray, groups: int) -> np.ndarray:
    """[K / (4 groups), 2, N]: max(sum of positive w, sum of |negative w|) over each set of weights one int16 lane
    of bench/micro/int8_gemm_paired.h sums when ``groups`` vpmaddubsw results are added: k = 4G i + 4g + 2p + j
    for g < G and j < 2, one set per (i, p) (K padded with 0)."""
    k, n = w.shape
    pad = (-k) % (4 * groups)
    wq = np.concatenate([w, np.zeros((pad, n))]).reshape(-1, groups, 2, 2, n)  # (i, g, p, j, n)
    return np.maximum(np.clip(wq, 0, None).sum((1, 3)), np.clip(-wq, 0, None).sum((1, 3)))


def group_limit(levels: int, groups: int) -> int:
    """The largest same-sign set sum of the float weights / step that keeps every int16 lane exact: the lane holds
    2G products of activations <= levels, so its integer set sum may reach 32767 // levels; rounding 2G weights
    adds at most G."""
    return 32767 // levels - groups


def lane_bounded_int8(w: np.ndarray, levels: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """``(q int8 [K, N], step float32 [N])``: symmetric per-column int8 of ``w`` ([K, N]) whose every lane set (see
    :func:`lane_group_sums`) sums, per sign, to at most 32767 // levels, so that the GEMM's int16 lanes are exact
    for activations on 0..levels; the step is max(max |w| / 127, largest same-sign set sum / group_limit)."""
    step = np.maximum(
        np.abs(w).max(axis=0) / 127, lane_group_sums(w, groups).max(axis=(0, 1)) / group_limit(levels, groups)
    )
    step = np.where(step > 0, step, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / step.astype(np.float64)), -127, 127)
    worst = int(lane_group_sums(q, groups).max())
    if worst * levels > 32767:  # cannot happen by the rounding argument; a saturating lane would be silently wrong
        raise AssertionError(f"lane-bounded: a lane's set sums to {worst}; x {levels} saturates int16")
    return q.astype(np.int8), step


def quant_weight(w: np.ndarray, rule: str, levels: int, groups: int) -> tuple[np.ndarray, float]:
    """Symmetric per-column int8 of ``w`` ([K, N]) by ``rule``: (the dequantized weights, float64; the median over
    columns of the step / the 8-bit step max |w| / 127)."""
    eight = np.abs(w).max(axis=0) / 127
    eight = np.where(eight > 0, eight, 1.0)
    if rule == "pair-bounded":
        q, s = pair_bounded_int8(w)
    elif rule == "lane-bounded":
        q, s = lane_bounded_int8(w, levels, groups)
    else:
        qmax = 64 if rule == "7-bit" else 127
        s = np.abs(w).max(axis=0) / qmax
        s = np.where(s > 0, s, 1.0)
        q = np.clip(np.rint(w / s), -qmax, qmax)
        if rule == "7-bit":
            assert int(lane_group_sums(q, groups).max()) * levels <= 32767, "7-bit: a lane saturates int16"
    s64 = np.asarray(s, np.float64)
    return q.astype(np.float64) * s64, float(np.median(s64 / eight))


FORMATS: list[tuple[str, bool, int, str, int]] = [
    # (label, per-row activations, activation levels, weight rule, vpmaddubsw results per int16 sum)
    ("per-tensor u8 x 8-bit (onnxruntime dynamic, VNNI)", False, 255, "8-bit", 1),
    ("per-tensor u8 x pair-bounded (onnxruntime, no VNNI: the shipped choice)", False, 255, "pair-bounded", 1),
    ("per-tensor u7 x 7-bit, paired", False, 127, "7-bit", 2),
    ("per-tensor u8 x lane-bounded, paired", False, 255, "lane-bounded", 2),
    ("per-row u8 x 8-bit (exact only with VNNI; for scale)", True, 255, "8-bit", 1),
    ("per-row u8 x lane-bounded, paired", True, 255, "lane-bounded", 2),
    ("per-row u7 x 7-bit, paired", True, 127, "7-bit", 2),
    ("per-row u7 x lane-bounded, paired", True, 127, "lane-bounded", 2),
    ("per-row u7 x lane-bounded, octet", True, 127, "lane-bounded", 4),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="100 queries")
    args = p.parse_args()
    torch.set_num_threads(2)

    case = get_case("minilm_retrieval", quick=args.quick)
    case.prepare(SilentProgress())
    bert = case._model.m
    linears = {
        name: mod
        for name, mod in bert.named_modules()
        if isinstance(mod, torch.nn.Linear) and ".layer." in name  # the 36 encoder MatMuls, not the pooler
    }
    assert len(linears) == 36, sorted(linears)
    originals = {name: mod.forward for name, mod in linears.items()}
    weights = {name: mod.weight.detach().double().numpy().T for name, mod in linears.items()}  # [K, N]

    def evaluate(label: str) -> tuple[float, float]:
        t = time.perf_counter()
        ev = case.evaluate(case.torch_runner(2), "native", SilentProgress(), label)
        harness.sync_print(f"  {label}: {time.perf_counter() - t:.0f} s")
        return ev

    ref = evaluate("fp32")
    rows = []
    for label, per_row, levels, rule, groups in FORMATS:
        done = {name: quant_weight(w, rule, levels, groups) for name, w in weights.items()}
        deq = {name: torch.from_numpy(d.T.copy()).float() for name, (d, _) in done.items()}
        ratio = float(np.median([r for _, r in done.values()]))

        def patched(mod: torch.nn.Linear, wq: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
            return lambda x: torch.nn.functional.linear(quant_activation(x, levels, per_row), wq, mod.bias)

        for name, mod in linears.items():
            mod.forward = patched(mod, deq[name])
        try:
            ev = evaluate(label)
        finally:
            for name, mod in linears.items():
                mod.forward = originals[name]
        rows.append(
            [
                label,
                f"{ratio:.2f}",
                f"{ev.metrics['MRR@10']:.4f}",
                f"{ref.metrics['MRR@10'] - ev.metrics['MRR@10']:+.4f}",
                f"{cosine_rows(ref.rows['sentence cosine'], ev.rows['sentence cosine']).mean():.5f}",
                f"{cosine_rows(ref.rows['token cosine'], ev.rows['token cosine']).mean():.5f}",
            ]
        )

    harness.header("all-MiniLM-L6-v2: accuracy of int8 formats for a paired vpmaddubsw GEMM")
    d = case.data
    print(
        f"data: {len(d.queries)} queries, {len(d.corpus)} documents; reference: torch fp32, MRR@10 "
        f"{ref.metrics['MRR@10']:.4f}; 36 weight MatMuls fake-quantized, attention in float\n"
    )
    print(
        harness.md_table(
            [
                "activations x weights, form",
                "median weight step / 8-bit",
                "MRR@10",
                "MRR drop",
                "sentence cos",
                "token cos",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
