"""TwoPassSoftmax: softmax computed in two passes over the input, with no max pass.

    y_i = exp(x_i - m) / sum_j exp(x_j - m),   m = max_j x_j,   along ``axis``

Same values as ``ai.onnx.Softmax(axis)`` (opset 13) and ``torch.softmax``. -inf entries give exactly
0; a row that holds NaN or +inf, or only -inf entries, is all NaN (ai.onnx.Softmax and torch agree).

The kernel (ops/two_pass_softmax.cc) follows Dukhan & Ablavatski, "The Two-Pass Softmax Algorithm"
(arXiv 2001.04438): pass 1 accumulates sum_j exp(x_j) as a (mantissa, exponent) pair whose exponent
is held in float, so it cannot overflow and needs no max pass; pass 2 writes
``y_i = m_i / m_sum * 2^(n_i - n_sum)``. Relative error <= 1e-6 against the float64 reference for
finite rows up to |x| ~ 1e4 (outputs below the float32 normal range, ~1e-38, flush to 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.ops._body import function_body
from softdeploy.ops._common import as_float64, normalize_axis, require_rank_at_least_one, softmax64
from softdeploy.ops._schema import Attr, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import opset18 as op

NAME = "TwoPassSoftmax"


def validate(x: Any, axis: int) -> int:
    """Checks TwoPassSoftmax's inputs and attributes and raises OpContractError naming the op, the value and the rule
    (in the kernel's words); returns the axis, normalised to [0, rank)."""
    require_rank_at_least_one(NAME, x)
    return normalize_axis(NAME, axis, np.ndim(x))


def reference(x: np.ndarray, *, axis: int = -1) -> tuple[np.ndarray]:
    """The float64 NumPy oracle of TwoPassSoftmax: every backend (kernel, function body, torch, TVM) is held to it
    within OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    a = validate(x, axis)
    return (softmax64(as_float64(x), a),)


@function_body
def TwoPassSoftmax(X, axis: int = -1):
    return op.Softmax(X, axis=axis)


def torch_impl(x: Any, axis: int = -1) -> Any:
    """Eager torch TwoPassSoftmax (computed in float32, returned in the input's type), registered as
    torch.ops.softdeploy.two_pass_softmax; it checks the contract first, like every backend."""
    import torch

    validate(x, axis)
    return torch.softmax(x.float(), dim=axis).to(x.dtype)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for TwoPassSoftmax: the output has the input's type and shape."""
    ctx.set_output_type(0, ctx.get_input_type(0))


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of TwoPassSoftmax, drawn from ``rng``: typical sizes, edge sizes (empty, one element, the
    kernels' tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def logits(*shape: int, scale: float = 3.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    yield Sample("rows_4x37", (logits(4, 37),))
    yield Sample("vocab_4x32000", (logits(4, 32000),))
    yield Sample("axis0_3d", (logits(7, 3, 5),), {"axis": 0})
    yield Sample("axis1_3d", (logits(2, 33, 3),), {"axis": 1})
    yield Sample("axis_minus2", (logits(5, 6, 4),), {"axis": -2})
    # tile edges of the AVX-512 (16, 48) / AVX2 (8, 16) loops and the 1024-element summation block
    for n in (1, 7, 8, 15, 16, 17, 47, 48, 49, 1023, 1024, 1025, 3073):
        yield Sample(f"n{n}", (logits(3, n),), kind="edge")
    yield Sample("empty_rows", (np.zeros((0, 5), np.float32),), kind="edge")
    yield Sample("empty_axis", (np.zeros((3, 0), np.float32),), kind="edge")
    yield Sample("rank1", (logits(100),), kind="edge")
    big = logits(2, 300)
    big[0] += 1e4
    big[1] -= 1e4
    yield Sample("large_magnitude_1e4", (big,), kind="special")
    yield Sample("wide_range", (np.linspace(-1e4, 1e4, 2 * 99, dtype=np.float32).reshape(2, 99),), kind="special")
    special = logits(6, 50)
    special[0, 3] = special[0, 20] = -np.inf  # masked entries -> exactly 0
    special[1, :] = -np.inf  # fully masked row -> NaN
    special[2, 7] = np.nan  # NaN row
    special[3, 11] = np.inf  # +inf row -> NaN
    special[4, :] = 2.5  # ties -> uniform
    special[5, :49] = -np.inf  # one finite entry -> exactly 1
    yield Sample("inf_nan_ties", (special,), kind="special")
    # One finite entry far below 0, the rest masked: the AVX-512 path once let the masked lanes' block
    # exponent (0) scale the row sum to a subnormal whose reciprocal overflowed (y = inf for x <= -87.3).
    lone = np.full((6, 40), -np.inf, np.float32)
    for row, (col, value) in enumerate(((0, -89.0), (5, -100.0), (17, -87.5), (39, -150.0), (16, -3e4), (3, -1e6))):
        lone[row, col] = value
    yield Sample("one_finite_entry_far_below_zero", (lone,), kind="special")
    yield Sample("one_element_minus_89", (np.array([[-89.0]], np.float32),), kind="special")
    # Finite entries in two summation blocks (1024 entries), the rest masked: the AVX2 path once let the
    # masked lanes' exponent flush the live blocks' factors to 0 (3.4e-30 came out 0).
    two_blocks = np.full((3, 1100), -np.inf, np.float32)
    two_blocks[0, [5, 1030]] = (-20.0, -100.0)  # exp(-80) = 1.8e-35
    two_blocks[1, [0, 1024]] = (-50.0, -120.0)  # exp(-70) = 4e-31
    two_blocks[2, [1, 1099]] = (-100.0, -100.0)
    yield Sample("masked_rows_two_blocks", (two_blocks,), kind="special")
    # Beyond |x| ~ 2.9e6 a float range reduction of x log2(e) is off by more than ln2/2: every variant
    # must take its exact path (the portable one once returned 9.5e-2 relative error at 5.6e7).
    far = logits(4, 33)
    far[0] += 5.6e7
    far[1] -= 5.6e7
    far[2] += 3e6
    far[3, ::2] -= 1e9
    yield Sample("beyond_float_range_reduction", (far,), kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of TwoPassSoftmax; every backend must refuse them with a message containing ``match``
    (the operator reference lists them)."""
    x = np.zeros((2, 3), np.float32)
    yield ErrorCase("axis_out_of_range", (x,), {"axis": 2}, "axis 2 is out of range for an input of rank 2")
    yield ErrorCase("axis_too_negative", (x,), {"axis": -3}, "axis -3 is out of range")
    yield ErrorCase("scalar_input", (np.array(1.0, np.float32),), {}, "input must have rank >= 1")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(Port("X"),),
    outputs=(Port("Y"),),
    attrs=(Attr("axis", int, -1, "axis along which to normalise; negative counts from the back"),),
    reference=reference,
    function=TwoPassSoftmax,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    infer_shapes=infer_shapes,
    tolerance={"float32": (1e-6, 1e-37), "float16": (2e-3, 1e-7)},
    source="Dukhan & Ablavatski 2020, arXiv 2001.04438; XNNPACK f32-raddextexp / f32-vscaleextexp",
)
