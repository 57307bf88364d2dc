"""SoftmaxTopK: the k largest softmax probabilities and their positions, fused, without ever forming
the probability row.

    z = X / temperature
    Values, Indices = TopK(Softmax(z, axis), k, axis, largest=1, sorted=1)
    LogSumExp       = m + log sum_j exp(z_j - m),   m = max_j z_j    (optional; `axis` kept as size 1)

``Values[..., i]`` are the k largest probabilities in descending order, ``Indices`` (int64) their
positions along ``axis``. Attributes: ``k`` (required, 1 <= k <= axis length), ``axis`` (default -1),
``temperature`` (default 1.0, > 0).

Ranking rule (one total order for every row, the tie rule of docs/ops/SoftmaxTopK.md):
  * entries are ranked by their logit ``x`` -- the same order as their exact probabilities, since
    softmax is strictly increasing -- larger first, equal logits -> lower index first. So entries
    whose probability underflows to 0 (including -inf entries: ordinary candidates with probability
    exactly 0 and their real index) are still ordered by logit, then index;
  * NaN ranks above +inf (torch.topk's convention), +inf above every finite value, -inf last.
Special rows (ai.onnx.Softmax / torch semantics for the values, torch.logsumexp for LogSumExp):
  * a row holding NaN: Values all NaN, LogSumExp NaN, Indices = the NaN positions first (ranking rule);
  * a row holding +inf (no NaN): Values all NaN (inf - inf), LogSumExp +inf, Indices by the rule;
  * a row entirely -inf: Values all NaN (0/0), LogSumExp -inf, Indices 0, 1, ..., k-1.
Literally composing ai.onnx.Softmax -> TopK would tie every entry of such a row (all NaN); ranking the
logits instead keeps the indices informative (they point at the NaN / +inf) and is what this op and
its function body do.

The kernel (ops/softmax_topk.cc) reads X once per row. The AVX-512 and AVX2 variants (the AVX2 one
written over the vector traits in ops/softmax_topk_kernels.h, compiled in ops/softmax_topk_avx2.cc) sum
the normaliser against one reference per row, raised when a larger logit comes (the online normalizer
of Milakov & Gimelshein, ``m' = max(m, z); d' = d*e^(m - m') + e^(z - m')``, with m moved rarely),
fused with a thresholded selection: only entries above the current k-th value enter a candidate
buffer, cut back exactly to the k best when full. The portable variant runs the recurrence in double
with a size-k heap. Values are formed for the k winners only. Relative error <= 2e-6 against the
float64 reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from softdeploy.errors import OpContractError
from softdeploy.ops._body import function_body
from softdeploy.ops._common import as_float64, normalize_axis, require_rank_at_least_one
from softdeploy.ops._schema import Attr, ErrorCase, OpDef, Port, Sample

if TYPE_CHECKING:  # bound when the body is compiled (softdeploy/ops/_body.py)
    from onnxscript import opset18 as op

NAME = "SoftmaxTopK"


def validate(x: Any, k: int, axis: int, temperature: float) -> int:
    """Checks the contract; returns the normalised axis. Messages match ops/softmax_topk.cc."""
    require_rank_at_least_one(NAME, x)
    a = normalize_axis(NAME, axis, len(x.shape))
    if k < 1:
        raise OpContractError(f"{NAME}: k {k} is out of range (rule: k >= 1)")
    n = int(x.shape[a])
    if k > n:
        raise OpContractError(f"{NAME}: k {k} is larger than the axis length {n} (rule: 1 <= k <= axis length)")
    if not temperature > 0:
        raise OpContractError(f"{NAME}: temperature {temperature:g} is out of range (rule: temperature > 0)")
    return a


def _rank_order(x: np.ndarray) -> np.ndarray:
    """Indices of a 2-D array's rows sorted by the ranking rule: NaN, +inf, finite descending, -inf;
    equal keys by lower index first (a stable sort)."""
    key = np.where(np.isnan(x), -np.inf, -x)  # ascending key: NaN first, then +inf (-inf key), ...
    nan_first = np.where(np.isnan(x), 0, 1)
    return np.lexsort((key, nan_first), axis=-1)


def reference(
    x: np.ndarray, *, k: int, axis: int = -1, temperature: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The float64 NumPy oracle of SoftmaxTopK: every backend (kernel, function body, torch, TVM) is held to it within
    OpDef.tolerance; it checks the contract first, so a bad input raises the same OpContractError."""
    a = validate(x, k, axis, temperature)
    x64 = np.moveaxis(as_float64(x), a, -1)
    lead = x64.shape[:-1]
    rows = x64.reshape(-1, x64.shape[-1])
    idx = _rank_order(rows)[:, :k] if rows.shape[0] else np.zeros((0, k), np.int64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # ONNX float attributes are float32: the op's temperature is float32(temperature).
        z = rows / np.float64(np.float32(temperature))
        has_nan = np.isnan(z).any(axis=-1)
        has_posinf = (z == np.inf).any(axis=-1)
        m = z.max(axis=-1, initial=-np.inf, where=~np.isnan(z))
        finite_m = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(z - finite_m[:, None])
        d = e.sum(axis=-1)
        lse = finite_m + np.log(d)
        values = np.take_along_axis(e, idx, axis=-1) / d[:, None]
    special = has_nan | has_posinf | (m == -np.inf)
    values[special] = np.nan
    lse = np.where(has_nan, np.nan, np.where(has_posinf, np.inf, np.where(m == -np.inf, -np.inf, lse)))

    def back(t: np.ndarray, width: int) -> np.ndarray:
        return np.moveaxis(t.reshape(*lead, width), -1, a)

    return back(values, k), back(idx.astype(np.int64), k), back(lse[:, None], 1)


@function_body
def SoftmaxTopK(X, k: int, axis: int = -1, temperature: float = 1.0):
    # Ranking key (see the module docstring): the logits in float64 -- where every float32/float16
    # value is exact and distinct -- with +inf moved to DBL_MAX and NaN to +inf, so that NaN ranks
    # above +inf above every finite value. ai.onnx.TopK keeps lower indices first on ties.
    xd = op.Cast(X, to=11)
    above_finite = op.Mul(op.CastLike(op.Constant(value_float=3.4028234663852886e38), xd), op.CastLike(2.0, xd))
    key = op.Where(op.IsInf(xd, detect_negative=0), above_finite, xd)
    key = op.Where(op.IsNaN(xd), op.CastLike(op.Constant(value_float=float("inf")), xd), key)
    K = op.Reshape(op.Constant(value_int=k), op.Constant(value_ints=[1]))
    _, Indices = op.TopK(key, K, axis=axis, largest=1, sorted=1)
    z = op.Div(op.Cast(X, to=1), op.Constant(value_float=temperature))
    Values = op.CastLike(op.GatherElements(op.Softmax(z, axis=axis), Indices, axis=axis), X)
    # log-sum-exp shifted by the row max (0 where the max is +-inf: then exp gives inf or 0 directly).
    axes = op.Reshape(op.Constant(value_int=axis), op.Constant(value_ints=[1]))
    m = op.ReduceMax(z, axes, keepdims=1)
    m = op.Where(op.IsInf(m), op.CastLike(op.Constant(value_float=0.0), m), m)
    lse = op.Add(m, op.Log(op.ReduceSum(op.Exp(op.Sub(z, m)), axes, keepdims=1)))
    LogSumExp = op.CastLike(lse, X)
    return Values, Indices, LogSumExp


def torch_impl(x: Any, k: int, axis: int = -1, temperature: float = 1.0) -> Any:
    """Eager torch SoftmaxTopK (computed in float32, returned in the input's type), registered as
    torch.ops.softdeploy.softmax_topk; it checks the contract first, like every backend."""
    import torch

    a = validate(x, k, axis, temperature)
    if x.numel() == 0:  # nothing to select; X [0, 2^40] would make torch's sort allocate along the axis
        shape, lse_shape = list(x.shape), list(x.shape)
        shape[a], lse_shape[a] = k, 1
        return x.new_empty(shape), torch.empty(shape, dtype=torch.int64), x.new_empty(lse_shape)
    xf = x.float()
    # A stable descending sort puts NaN first and keeps lower indices first on ties (torch.topk
    # guarantees neither tie order); the logits' order is the probabilities' order.
    indices = torch.sort(xf, dim=axis, descending=True, stable=True).indices.narrow(axis, 0, k)
    z = xf / temperature
    values = torch.gather(torch.softmax(z, dim=axis), axis, indices)
    lse = torch.logsumexp(z, dim=axis, keepdim=True)
    return values.to(x.dtype), indices, lse.to(x.dtype)


def torch_fake(x: Any, k: int, axis: int = -1, temperature: float = 1.0) -> Any:
    """SoftmaxTopK on torch's fake tensors (export tracing): the contract checks, then empty Values and Indices with k
    along the axis and a LogSumExp with 1 there."""
    import torch

    a = validate(x, k, axis, temperature)
    shape = list(x.shape)
    shape[a] = k
    lse_shape = list(x.shape)
    lse_shape[a] = 1
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64), x.new_empty(lse_shape)


def infer_shapes(ctx: Any) -> None:
    """ONNX shape inference for SoftmaxTopK: Values in the input's type and Indices int64, both with k along the axis;
    LogSumExp with 1 there."""
    from onnx import TensorProto, helper

    x_type = ctx.get_input_type(0)
    elem = x_type.tensor_type.elem_type
    ctx.set_output_type(0, helper.make_tensor_type_proto(elem, None))
    ctx.set_output_type(1, helper.make_tensor_type_proto(TensorProto.INT64, None))
    if ctx.get_num_outputs() > 2:
        ctx.set_output_type(2, helper.make_tensor_type_proto(elem, None))


def samples(rng: np.random.Generator) -> Iterator[Sample]:
    """The conformance inputs of SoftmaxTopK, drawn from ``rng``: typical sizes, edge sizes (empty, one element, the
    kernels' tile edges) and special values (+-inf, NaN, ties) on which every backend must agree."""

    def logits(*shape: int, scale: float = 3.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    yield Sample("rows_4x37_k5", (logits(4, 37),), {"k": 5})
    yield Sample("vocab_4x32000_k50", (logits(4, 32000),), {"k": 50})
    yield Sample("vocab_2x51864_k1", (logits(2, 51864),), {"k": 1})
    yield Sample("temperature_0.5", (logits(3, 300),), {"k": 10, "temperature": 0.5})
    yield Sample("temperature_7", (logits(3, 300),), {"k": 4, "temperature": 7.0})
    yield Sample("axis0_3d", (logits(7, 3, 5),), {"k": 3, "axis": 0})
    yield Sample("axis1_3d", (logits(2, 33, 3),), {"k": 2, "axis": 1})
    yield Sample("axis_minus2", (logits(5, 6, 4),), {"k": 6, "axis": -2})
    # SIMD tile edges (16-lane vectors, 512-element blocks), k = n, one element, empty batch
    for n in (1, 2, 15, 16, 17, 31, 33, 511, 512, 513, 1025, 4099):
        yield Sample(f"n{n}", (logits(3, n),), {"k": min(n, 3)}, kind="edge")
    yield Sample("k_equals_n_64", (logits(3, 64),), {"k": 64}, kind="edge")
    yield Sample("k_equals_n_300", (logits(2, 300),), {"k": 300}, kind="edge")
    yield Sample("k_200_of_2000", (logits(2, 2000),), {"k": 200}, kind="edge")
    yield Sample("ascending_row", (np.arange(3000, dtype=np.float32)[None, :] * 1e-3,), {"k": 20}, kind="edge")
    yield Sample("empty_rows", (np.zeros((0, 5), np.float32),), {"k": 2}, kind="edge")
    yield Sample("rank1", (logits(100),), {"k": 7}, kind="edge")
    big = logits(2, 300)
    big[0] += 1e4
    big[1] -= 1e4
    yield Sample("large_magnitude_1e4", (big,), {"k": 5}, kind="special")
    yield Sample("tiny_temperature", (logits(2, 100),), {"k": 3, "temperature": 1e-3}, kind="special")
    special = logits(8, 50)
    special[0, 3] = special[0, 20] = -np.inf  # masked entries: probability 0, real index
    special[1, :] = -np.inf  # fully masked row -> NaN values, -inf LogSumExp, indices 0..k-1
    special[2, 7] = np.nan  # NaN row -> NaN, NaN index first
    special[3, 11] = np.inf  # +inf row -> NaN values, +inf LogSumExp, +inf index first
    special[4, :] = 2.5  # all tied -> indices 0..k-1
    special[5, :49] = -np.inf  # one finite entry -> 1 then zeros at indices 0, 1, ...
    special[6, ::3] = 1.0  # ties among winners -> lower index first
    special[6, 1::3] = 1.0 - 2**-20
    special[6, 2::3] = -5.0
    special[7, :] = -np.inf  # only -inf and NaN
    special[7, 30] = np.nan
    yield Sample("inf_nan_ties", (special,), {"k": 6}, kind="special")
    masked = logits(2, 2000)
    masked[:, 100:1900] = -np.inf  # a mostly masked vocabulary
    yield Sample("masked_vocab", (masked,), {"k": 8}, kind="special")
    under = np.array([[0.0, -200.0, -1000.0, -150.0, -np.inf, -1000.0, 3.0, -2000.0]], np.float32)
    yield Sample("underflowing_probabilities", (under,), {"k": 8}, kind="special")


def errors() -> Iterator[ErrorCase]:
    """Inputs that break each rule of SoftmaxTopK; every backend must refuse them with a message containing ``match``
    (the operator reference lists them)."""
    x = np.zeros((2, 3), np.float32)
    yield ErrorCase("k_zero", (x,), {"k": 0}, "k 0 is out of range (rule: k >= 1)")
    yield ErrorCase("k_negative", (x,), {"k": -2}, "k -2 is out of range (rule: k >= 1)")
    yield ErrorCase("k_above_axis_length", (x,), {"k": 4}, "k 4 is larger than the axis length 3")
    yield ErrorCase("k_above_axis_0", (x,), {"k": 3, "axis": 0}, "k 3 is larger than the axis length 2")
    yield ErrorCase("temperature_zero", (x,), {"k": 1, "temperature": 0.0}, "temperature 0 is out of range")
    yield ErrorCase("temperature_negative", (x,), {"k": 1, "temperature": -1.5}, "temperature -1.5 is out of range")
    yield ErrorCase("axis_out_of_range", (x,), {"k": 1, "axis": 2}, "axis 2 is out of range for an input of rank 2")
    yield ErrorCase("scalar_input", (np.float32(1.0).reshape(()),), {"k": 1}, "input must have rank >= 1")


DEF = OpDef(
    name=NAME,
    doc=__doc__ or "",
    inputs=(Port("X"),),
    outputs=(
        Port("Values", doc="the k largest probabilities along axis, descending"),
        Port("Indices", "int64", doc="their positions along axis (ties: lower index first)"),
        Port("LogSumExp", optional=True, doc="m + log sum exp(z - m) with axis kept as size 1"),
    ),
    attrs=(
        Attr("k", int, doc="how many entries to keep; 1 <= k <= axis length"),
        Attr("axis", int, -1, "axis along which to normalise and select; negative counts from the back"),
        Attr("temperature", float, 1.0, "softmax temperature (> 0): probabilities of X / temperature"),
    ),
    reference=reference,
    function=SoftmaxTopK,
    samples=samples,
    errors=errors,
    torch_impl=torch_impl,
    torch_fake=torch_fake,
    infer_shapes=infer_shapes,
    tolerance={"float32": (2e-6, 1e-37), "float16": (2e-3, 1e-7)},
    source="Milakov & Gimelshein 2018, arXiv 1805.02867 (online normalizer, Algorithm 4); "
    "NVIDIA/online-softmax online_softmax_benchmark.cu",
    stem_override="softmax_topk",
)
