"""MultiMax as one TIR PrimFunc (equation and special values: softdeploy/ops/multi_max.py).

    sigma(x) = x + t0*relu(r0 - x) + t1*relu(x - r1) + t2*relu(r2 - x)^2 + t3*relu(x - r3)^2
    Y = softmax(sigma(X) + Mask, axis)

sigma and the broadcast Mask are applied on the fly in each loop over the row (never stored), as in
the C++ kernel; sigma(+-inf) is sigma's limit, a non-finite parameter makes every output NaN. The
softmax is TwoPassSoftmax's (``two_pass_softmax.softmax_of``): same blocks, so TwoPassSoftmax's hand
schedule applies to this kernel too.
"""

from __future__ import annotations

from typing import Any

from tvm import te, tirx

from softdeploy.ops import multi_max as op
from softdeploy.tvm.ops._te import as_f32, exp_f32, f32, is_finite, shape_proxy
from softdeploy.tvm.ops.two_pass_softmax import softmax_of

_INF = float("inf")
# Kept stored when the neighbours are inlined (softdeploy.tvm.ops.inline_neighbours): the per-call
# parameters (inlined, recomputed per element).
KEEP_BLOCKS = ("multimax_params",)


def _relu(v: Any) -> Any:
    return tirx.max(v, f32(0.0))


def _limits(rf: Any, tf: Any, c: Any) -> Any:
    """c = 0: sigma(-inf), 1: sigma(+inf), 2: 0 if every parameter is finite else NaN."""
    r = [rf(i) for i in range(4)]
    t = [tf(i) for i in range(4)]
    neg_lin = tirx.Select(t[0] < f32(1.0), f32(-_INF), tirx.Select(t[0] > f32(1.0), f32(_INF), r[0]))
    neg = tirx.Select(t[2] > f32(0.0), f32(_INF), tirx.Select(t[2] < f32(0.0), f32(-_INF), neg_lin))
    pos_lin = tirx.Select(t[1] > f32(-1.0), f32(_INF), tirx.Select(t[1] < f32(-1.0), f32(-_INF), r[1]))
    pos = tirx.Select(t[3] > f32(0.0), f32(_INF), tirx.Select(t[3] < f32(0.0), f32(-_INF), pos_lin))
    finite = tirx.all(*(is_finite(v) for v in (*r, *t)))
    poison = tirx.Select(finite, f32(0.0), f32(float("nan")))
    return tirx.Select(c == 0, neg, tirx.Select(c == 1, pos, poison))


def compute(x: te.Tensor, ranges: te.Tensor, ts: te.Tensor, mask: te.Tensor | None, axis: int) -> te.Tensor:
    """MultiMax as a TE compute: softmax(sigma(x) + mask) along ``axis``, sigma's limits and NaN poison computed once
    per call in their own block."""
    shape = list(x.shape)
    xf, rf, tf = as_f32(x), as_f32(ranges), as_f32(ts)
    mf = None if mask is None else as_f32(mask)
    # sigma's limits at -inf / +inf and the NaN poison of non-finite parameters, computed once per call
    # in their own block (kept by inline_neighbours) instead of per element
    params = te.compute((3,), lambda c: _limits(rf, tf, c), name="multimax_params")
    r = [rf(c) for c in range(4)]
    t = [tf(c) for c in range(4)]
    neg, pos, poison = params[0], params[1], params[2]
    rank, mask_rank = len(shape), 0 if mask is None else len(mask.shape)

    def z(*i: Any) -> Any:
        v = xf(*i)
        a, b, c, d = _relu(r[0] - v), _relu(v - r[1]), _relu(r[2] - v), _relu(v - r[3])
        s = v + t[0] * a + t[1] * b + (t[2] * c) * c + (t[3] * d) * d  # (t*relu)*relu: a zero t adds 0
        s = tirx.Select(v == f32(-_INF), neg, tirx.Select(v == f32(_INF), pos, s)) + poison
        if mf is not None:  # numpy broadcasting from the right; size-1 dims read index 0
            mi = [0 if int(mask.shape[d]) == 1 else i[rank - mask_rank + d] for d in range(mask_rank)]
            s = s + mf(*mi)
        return s

    # exp_f32, not softmax_of's default exp_nonpositive_f32: measured, the shorter exp made this kernel
    # 1.45x slower on 1536 x 128 rows (281 -> 410 us; bench/tvm_ops.py) and only 1.1x faster on 4 x 32000
    return softmax_of(shape, axis, z, x.dtype, exp=exp_f32)


def convert(bb: Any, inputs: list[Any], attrs: dict[str, Any]) -> Any:
    """Relax converter for MultiMax (optional mask): checks the contract on the static shapes and emits one PrimFunc."""
    x, ranges, ts = inputs[:3]
    mask = inputs[3] if len(inputs) > 3 else None
    axis = op.validate(shape_proxy(x), shape_proxy(ranges), shape_proxy(ts), shape_proxy(mask), int(attrs["axis"]))
    return bb.emit_te(compute, x, ranges, ts, mask, axis, primfunc_name_hint="multi_max")
