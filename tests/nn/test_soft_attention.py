"""softdeploy.nn.SoftmaxFreeAttention (SOFT, Lu et al. 2021) and load_soft_attention.

The reference below is SOFT's forward (fudan-zvg/SOFT models/softmax_free_transformer.py,
SoftmaxFreeAttention + SoftmaxFreeAttentionKernel, kernel/inverse.py newton_inv) rewritten in float64
from SOFT's own parameter names, with the Nystrom matrix formed densely (O(n^2)): it shares no code
with the module (LayerNorm and GELU written out, pooling as a reshape-mean, distances as differences).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import softdeploy
from softdeploy import nn as sdnn
from softdeploy.errors import InputError, WeightsError

G = torch.Generator().manual_seed(15)
EPS32 = float(np.finfo(np.float32).eps)
# test-side copy of the name table (SOFT -> softdeploy): the loader test checks the module's own table against it
SOFT_TO_OURS = {
    "W_q.weight": "q_proj.weight",
    "W_q.bias": "q_proj.bias",
    "W_v.weight": "v_proj.weight",
    "W_v.bias": "v_proj.bias",
    "attn.Qlandmark_op.weight": "landmark_proj.weight",
    "attn.Qnorm_act.0.weight": "landmark_norm.weight",
    "attn.Qnorm_act.0.bias": "landmark_norm.bias",
    "attn.conv.weight": "v_conv.weight",
    "ff.weight": "out_proj.weight",
    "ff.bias": "out_proj.bias",
}


def randn(*shape: int, s: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=G) * s


def soft_state_dict(e: int, heads: int, ratio: int, conv_size: int = 0) -> dict[str, torch.Tensor]:
    """Random weights in SOFT's layout (shapes as SOFT's SoftmaxFreeAttention creates them)."""
    d = e // heads
    sd = {
        "W_q.weight": randn(e, e, s=e**-0.5),
        "W_q.bias": randn(e, s=0.1),
        "W_v.weight": randn(e, e, s=e**-0.5),
        "W_v.bias": randn(e, s=0.1),
        "attn.Qlandmark_op.weight": randn(d, d, ratio, ratio, s=(d * ratio * ratio) ** -0.5),
        "attn.Qnorm_act.0.weight": 1 + randn(d, s=0.1),
        "attn.Qnorm_act.0.bias": randn(d, s=0.1),
        "ff.weight": randn(e, e, s=e**-0.5),
        "ff.bias": randn(e, s=0.1),
    }
    if conv_size:
        sd["attn.conv.weight"] = randn(heads, 1, conv_size, conv_size, s=1 / conv_size)
    return sd


def soft_reference(sd, x, heads, ratio, landmarks, size=None, iters=20, reg=0.01, ln_eps=1e-5):
    """SOFT's attention in float64 with the dense Nystrom matrix; returns out [B, n, E]."""
    sd = {k: v.double() for k, v in sd.items()}
    x = x.double()
    b, n, e = x.shape
    d = e // heads
    q = (x @ sd["W_q.weight"].T + sd["W_q.bias"]).reshape(b, n, heads, d).transpose(1, 2)
    v = (x @ sd["W_v.weight"].T + sd["W_v.bias"]).reshape(b, n, heads, d).transpose(1, 2)
    q = q / math.sqrt(math.sqrt(d))  # SOFT: Q / D^(1/4), then exp(-|a - b|^2 / 2)
    if landmarks == "pool":
        m = n // ratio
        lm = q[:, :, : m * ratio].reshape(b, heads, m, ratio, d).mean(3)
    else:
        if landmarks == "conv2d":
            h, w = size
            grid = q.reshape(b * heads, h, w, d).permute(0, 3, 1, 2)
            y = F.conv2d(grid, sd["attn.Qlandmark_op.weight"], stride=ratio).flatten(2)
        else:
            y = F.conv1d(q.reshape(b * heads, n, d).transpose(1, 2), sd["attn.Qlandmark_op.weight"], stride=ratio)
        y = y.transpose(1, 2).reshape(b, heads, -1, d)
        mu = y.mean(-1, keepdim=True)
        var = ((y - mu) ** 2).mean(-1, keepdim=True)
        y = (y - mu) / torch.sqrt(var + ln_eps) * sd["attn.Qnorm_act.0.weight"] + sd["attn.Qnorm_act.0.bias"]
        lm = 0.5 * y * (1 + torch.erf(y / math.sqrt(2)))

    def kernel(a, c):
        return torch.exp(-((a[..., :, None, :] - c[..., None, :, :]) ** 2).sum(-1) / 2)

    k1, k2 = kernel(q, lm), kernel(lm, lm)
    # SOFT's newton_inv: alpha from K2 before the 0.01 I, P = K2 + reg I, V <- 2V - V P V
    alpha = 0.9 * 2 / k2.sum(-1).amax(-1) ** 2
    p = k2 + reg * torch.eye(k2.shape[-1], dtype=torch.float64)
    vt = alpha[..., None, None] * p
    for _ in range(iters):
        vt = 2 * vt - vt @ p @ vt
    s_dense = k1 @ vt @ k1.transpose(-1, -2)  # [n, n]: the approximated kernel attention matrix
    o = s_dense @ v
    if "attn.conv.weight" in sd:
        h, w = size
        vg = v.reshape(b, heads, h, w, d).permute(0, 4, 1, 2, 3).reshape(b * d, heads, h, w)
        k = sd["attn.conv.weight"].shape[-1]
        conv = F.conv2d(vg, sd["attn.conv.weight"], padding=k // 2, groups=heads)
        o = o + conv.reshape(b, d, heads, h, w).flatten(3).permute(0, 2, 3, 1)
    out = o.transpose(1, 2).reshape(b, n, e) @ sd["ff.weight"].T + sd["ff.bias"]
    return out


def tolerance(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Float32 error bound of the module against the float64 reference. Derivation: the module's float32
    stages (the E-long projections, the landmark conv, LayerNorm/GELU, the output projection; the op itself
    computes in float64) each round like a k-long reduction, whose error grows as sqrt(k) * eps32 (Higham's
    statistical estimate; the worst case k * eps32 * cond(P) is ~1000x what is observed); 4 stages, a
    factor 4 for the amplification through the Gaussian kernel and the Newton-Schulz solve (cond(P) <= 60
    in these cases, the perturbation not along its worst direction), scaled by the largest |ref|. Observed:
    1.5 ... 4.5 eps32 * max|ref|; this bound is 90 eps32 * max|ref| for k = 32."""
    k = x.shape[-1]
    return 4 * 4 * math.sqrt(k) * EPS32 * float(ref.abs().max())


def soft_layout(module: sdnn.SoftmaxFreeAttention) -> dict[str, torch.Tensor]:
    ours_to_soft = {v: k for k, v in SOFT_TO_OURS.items()}
    return {ours_to_soft[k]: v for k, v in module.state_dict().items()}


CASES = [  # (landmarks, ratio, n or grid, conv_size)
    ("conv2d", 2, (4, 6), 3),
    ("conv2d", 3, (7, 6), 0),  # 7 rows: the last one fills no window (SOFT's strided conv drops it)
    ("conv1d", 4, 37, 0),
    ("pool", 5, 23, 0),
]


@pytest.mark.parametrize(("landmarks", "ratio", "shape", "conv_size"), CASES)
@torch.no_grad()
def test_forward_is_soft_math(landmarks, ratio, shape, conv_size):
    e, heads = 32, 4
    size = shape if isinstance(shape, tuple) else None
    n = shape[0] * shape[1] if size else shape
    module = sdnn.SoftmaxFreeAttention(e, heads, ratio=ratio, landmarks=landmarks, conv_size=conv_size).eval()
    if module.landmark_norm is not None:  # not the identity LayerNorm of a fresh module
        module.landmark_norm.weight.copy_(1 + randn(e // heads, s=0.1))
        module.landmark_norm.bias.copy_(randn(e // heads, s=0.1))
    x = randn(2, n, e)
    ref = soft_reference(soft_layout(module), x, heads, ratio, landmarks, size)
    got = module(x, size) if size else module(x)
    err = float((got.double() - ref).abs().max())
    assert err <= tolerance(x, ref), (err, tolerance(x, ref))
    # in float64 the module is the same math (up to summation order and the op's |a|^2 + |b|^2 - 2ab distances)
    got64 = module.double()(x.double(), size) if size else module.double()(x.double())
    torch.testing.assert_close(got64, ref, rtol=1e-9, atol=1e-9 * float(ref.abs().max()))


@torch.no_grad()
def test_loader_round_trip_from_soft_layout(tmp_path):
    e, heads, ratio, k = 40, 5, 2, 3
    sd = soft_state_dict(e, heads, ratio, k)
    module = sdnn.load_soft_attention(sd)
    assert (module.num_heads, module.head_dim, module.ratio, module.conv_size) == (heads, 8, ratio, k)
    assert module.landmarks == "conv2d"
    for soft_name, ours in SOFT_TO_OURS.items():
        torch.testing.assert_close(module.state_dict()[ours], sd[soft_name], rtol=0, atol=0)
    x = randn(3, 24, e)
    ref = soft_reference(sd, x, heads, ratio, "conv2d", (4, 6))
    got = module(x, (4, 6))
    assert float((got.double() - ref).abs().max()) <= tolerance(x, ref)

    # files: safetensors, and a training checkpoint ({"model": whole-model state dict}) with a prefix
    from safetensors.torch import save_file

    save_file(sd, tmp_path / "attn.safetensors")
    whole = {f"block3.0.att.mha.{k_}": v for k_, v in sd.items()} | {"head.weight": randn(10, e)}
    torch.save({"model": whole, "epoch": 300}, tmp_path / "checkpoint.pth")
    for loaded in (
        sdnn.load_soft_attention(tmp_path / "attn.safetensors"),
        sdnn.load_soft_attention(str(tmp_path / "checkpoint.pth"), prefix="block3.0.att.mha."),
    ):
        torch.testing.assert_close(loaded(x, (4, 6)), got, rtol=0, atol=0)


def test_loader_names_missing_extra_keys_and_shapes(tmp_path):
    sd = soft_state_dict(32, 4, 2)
    with pytest.raises(WeightsError, match=r"missing keys \['ff.bias'\], unexpected keys \['attn.extra'\]"):
        sdnn.load_soft_attention({**{k: v for k, v in sd.items() if k != "ff.bias"}, "attn.extra": torch.zeros(1)})
    with pytest.raises(WeightsError, match=r"W_v.weight: \[32, 16\] \(want \[32, 32\]\)"):
        sdnn.load_soft_attention({**sd, "W_v.weight": torch.zeros(32, 16)})
    with pytest.raises(WeightsError, match=r"ratio-1 Linear layout"):
        sdnn.load_soft_attention({**sd, "attn.Qlandmark_op.weight": torch.zeros(8, 8)})
    with pytest.raises(WeightsError, match=r"attn.conv.weight has shape \[4, 1, 2, 2\]"):
        sdnn.load_soft_attention({**sd, "attn.conv.weight": torch.zeros(4, 1, 2, 2)})
    with pytest.raises(WeightsError, match=r"no key starts with prefix 'block1.0.att.mha.'"):
        sdnn.load_soft_attention(sd, prefix="block1.0.att.mha.")
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(WeightsError, match="not a readable safetensors file"):
        sdnn.load_soft_attention(tmp_path / "bad.safetensors")
    # a pickle of an arbitrary object is refused by weights_only, never executed
    torch.save({"W_q.weight": sd["W_q.weight"], "obj": WeightsError("x")}, tmp_path / "pickle.pth")
    with pytest.raises(WeightsError, match=r"weights_only=True"):
        sdnn.load_soft_attention(tmp_path / "pickle.pth")
    with pytest.raises(WeightsError, match="is not a file"):
        sdnn.load_soft_attention(tmp_path / "absent.pth")


def test_forward_input_errors():
    module = sdnn.SoftmaxFreeAttention(16, 2, ratio=2, landmarks="conv2d")
    with pytest.raises(InputError, match=r"need the token grid"):
        module(randn(1, 16, 16))
    with pytest.raises(InputError, match=r"size \(3, 4\) has 12 cells but x has n=16"):
        module(randn(1, 16, 16), (3, 4))
    with pytest.raises(InputError, match=r"n=3 tokens give no landmark at ratio 4"):
        sdnn.SoftmaxFreeAttention(16, 2, ratio=4, landmarks="pool")(randn(1, 3, 16))
    with pytest.raises(softdeploy.errors.ArgumentError, match="landmarks 'max'"):
        sdnn.SoftmaxFreeAttention(16, 2, landmarks="max")


class _OnGrid(torch.nn.Module):
    """SoftmaxFreeAttention on a fixed token grid (the grid is the model's, not an input)."""

    def __init__(self, attn: sdnn.SoftmaxFreeAttention, size: tuple[int, int]) -> None:
        super().__init__()
        self.attn, self.size = attn, size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, self.size)


@pytest.mark.parametrize(("landmarks", "ratio", "shape", "conv_size"), CASES[:1] + CASES[2:])
@torch.no_grad()
def test_export_is_one_nystrom_node_plus_standard_ops(landmarks, ratio, shape, conv_size):
    from softdeploy.runtime import Session

    e, heads = 32, 4
    size = shape if isinstance(shape, tuple) else None
    n = shape[0] * shape[1] if size else shape
    attn = sdnn.SoftmaxFreeAttention(e, heads, ratio=ratio, landmarks=landmarks, conv_size=conv_size)
    module = (_OnGrid(attn, size) if size else attn).eval()
    x = randn(2, n, e)
    result = softdeploy.export(module, (x,))
    assert result.validation is not None and result.validation.ok, result.validation
    custom = [node.op_type for node in result.model.graph.node if node.domain not in ("", "ai.onnx")]
    assert custom == ["NystromGaussianAttention"]
    node = next(nd for nd in result.model.graph.node if nd.op_type == "NystromGaussianAttention")
    attrs = {a.name: a for a in node.attribute}
    assert attrs["newton_iters"].i == 20 and math.isclose(attrs["regularization"].f, 0.01, rel_tol=1e-7)
    want = module(x).numpy()
    feeds = {result.model.graph.input[0].name: x.numpy()}
    for kernels in ("native", "portable"):
        (y,) = Session(result.model, kernels=kernels).run(feeds)
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()), err_msg=kernels)


@pytest.mark.parametrize("landmarks", ["conv1d", "pool"])
@torch.no_grad()
def test_export_with_dynamic_batch_and_sequence(landmarks):
    """Sequence landmarks export with a symbolic n (m = n // ratio follows it; lengths that fill no last window)."""
    from softdeploy.runtime import Session

    module = sdnn.SoftmaxFreeAttention(16, 2, ratio=4, landmarks=landmarks).eval()
    batch, seq = torch.export.Dim("batch", max=16), torch.export.Dim("seq", min=4, max=4096)
    result = softdeploy.export(module, (randn(2, 12, 16),), dynamic_shapes=({0: batch, 1: seq},))
    for n in (9, 203):
        x = randn(3, n, 16)
        (y,) = Session(result.model, kernels="native").run({result.model.graph.input[0].name: x.numpy()})
        want = module(x).numpy()
        # SOFT's output is not normalised (it grows with n): the bound is relative to its largest entry
        np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_gradient_is_the_gradient_of_soft_math():
    """The module trains as it exports: d out / d x (float64) is the reference's, through the Newton-Schulz steps."""
    module = sdnn.SoftmaxFreeAttention(16, 2, ratio=2, landmarks="conv2d", conv_size=3).double()
    x = randn(2, 12, 16).double().requires_grad_()
    weight = randn(2, 12, 16).double()
    (got,) = torch.autograd.grad((module(x, (3, 4)) * weight).sum(), x)
    with torch.no_grad():
        sd = soft_layout(module)
    (want,) = torch.autograd.grad((soft_reference(sd, x, 2, 2, "conv2d", (3, 4)) * weight).sum(), x)
    torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-8 * float(want.abs().max()))
