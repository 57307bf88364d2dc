"""PyTorch modules built on softdeploy's soft operators.

Every module calls ``torch.ops.softdeploy.<stem>`` (the registry's torch ops), so
:func:`softdeploy.export` turns each call into one ``com.softdeploy`` node with its portable function
body. The semantics of each op (special values, ties, masks) are those of docs/ops/, restated here
only as far as a module adds to them.

Normalizers (``[..., n] -> [..., n]`` along ``dim``):
    TwoPassSoftmax              y = softmax(x + mask)
    Softpick                    y_i = relu(e_i) / (sum_j |e_j| + eps),  e_j = exp(x_j - m) - exp(-m)
    MultiMax                    y = softmax(sigma(x) + mask),
                                sigma(x) = x + t0 relu(r0 - x) + t1 relu(x - r1)
                                             + t2 relu(r2 - x)^2 + t3 relu(x - r3)^2
    AdaptiveTemperatureSoftmax  y = softmax(beta(H) x),  H = entropy of softmax(x)

Attention (self-attention over ``x [B, T, E]``; ``H`` query heads, ``Hk`` key/value heads):
    S = Q K^T * scale + mask,  O = normalize(S) V,  out = O W_o
SOFT (softmax-free, Lu et al. 2021; :class:`SoftmaxFreeAttention`, K = Q, m landmarks L):
    O = K1 (K2 + reg I)^-1 (K1^T V),  K1 = kappa(Q, L),  K2 = kappa(L, L),  kappa = exp(-|a - b|^2 / (2 sqrt D))
    with the inverse as SOFT's Newton-Schulz iteration; :func:`load_soft_attention` reads SOFT's weights.
Heads: ``Linear -> normalizer``; :class:`SoftmaxTopKHead` returns the k most probable classes.
Soft thinking: :class:`SoftTokenEmbedding` (and :func:`soft_token_embedding`) turns next-token logits into the
    probability-weighted mixture of the top tokens' embeddings (the SoftTokenEmbedding op).
Retrieval: :class:`MaxSimScorer` ``score[b, n] = sum_i max_j <Q[b, i], D[n, j]>``.
Detection: :class:`SoftNMS` (Bodla et al. 2017), a drop-in for NonMaxSuppression with decayed scores.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from softdeploy.errors import ArgumentError, InputError, WeightsError
from softdeploy.ops import get as _get_op
from softdeploy.ops._torch import torch_op


def _op(name: str) -> Any:
    """The torch op of registry op ``name`` (registered on first use; clear error if unknown)."""
    return torch_op(_get_op(name))


# ---- normalizers ---------------------------------------------------------------------------------


class TwoPassSoftmax(nn.Module):
    """``y = softmax(x + mask, dim)`` through the two-pass kernel (no max pass, no overflow)."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """softmax(x + mask) along ``dim``; ``mask`` is additive (0 or -inf) and broadcasts to x."""
        if mask is not None:
            x = x + mask
        return _op("TwoPassSoftmax")(x, axis=self.dim)


class Softpick(nn.Module):
    """Softpick (Zuhri et al. 2025): rectified, not-sum-to-one softmax; exact zeros where ``x <= 0``.

    ``y_i = max(e_i, 0) / (sum_{j finite} |e_j| + eps)``, ``e_j = exp(x_j - m) - exp(-m)``,
    ``m`` = the row max over finite entries. ``-inf`` entries (masks) output 0.
    """

    def __init__(self, dim: int = -1, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = dim
        self.eps = eps

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """Softpick(x + mask) along ``dim``; ``mask`` is additive (0 or -inf; -inf entries output 0 and add nothing to
        the denominator)."""
        if mask is not None:
            x = x + mask
        return _op("Softpick")(x, axis=self.dim, eps=self.eps)


class MultiMax(nn.Module):
    """MultiMax (Zhou, Fritz & Keuper, ICML 2024): softmax of a learned piecewise modulator.

    ``sigma(x) = x + t0 relu(r0 - x) + t1 relu(x - r1) + t2 relu(r2 - x)^2 + t3 relu(x - r3)^2``,
    ``y = softmax(sigma(x) + mask, dim)``. The additive mask is applied **after** sigma (sigma of
    ``-inf`` is NaN). ``ranges = (r0, r1, r2, r3)`` and ``ts = (t0, t1, t2, t3)`` are learned; they
    start at zero (sigma = identity, as in the reference code's zero-initialised variant).
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim
        self.ranges = nn.Parameter(torch.zeros(4))
        self.ts = nn.Parameter(torch.zeros(4))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """softmax(sigma(x) + mask) along ``dim``, with this module's learned ranges and slopes; the mask is added after
        the modulator."""
        if mask is not None:
            mask = mask.to(x.dtype).expand_as(x)
        return _op("MultiMax")(x, self.ranges.to(x.dtype), self.ts.to(x.dtype), mask, axis=self.dim)


class AdaptiveTemperatureSoftmax(nn.Module):
    """Adaptive-temperature softmax (Velickovic et al. 2024, "softmax is not enough").

    ``p = softmax(x)``, ``H = -sum p log(p + 1e-9)``;
    ``beta = max(-0.037 H^4 + 0.481 H^3 - 2.3 H^2 + 4.917 H - 1.791, 1)`` if ``H > 0.5`` else 1;
    ``y = softmax(beta x)``: high-entropy rows are sharpened, confident rows left alone.
    """

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """softmax(beta(H) * (x + mask)) along ``dim``, beta chosen from the entropy H of softmax(x + mask)."""
        if mask is not None:
            x = x + mask
        return _op("AdaptiveTemperatureSoftmax")(x, axis=self.dim)


# ---- attention -----------------------------------------------------------------------------------


class SoftAttention(nn.Module):
    """Multi-head self-attention whose weights come from ``normalizer`` instead of softmax.

    ``x [B, T, E] -> Q [B, H, T, D], K, V [B, Hk, T, D]`` (grouped-query heads when ``Hk < H``),
    ``S = Q K^T / sqrt(D)``, ``A = normalizer(S, mask)`` along the key axis, ``out = (A V) W_o``.
    ``attn_mask`` is additive (0 or ``-inf``) and broadcastable to ``[B, H, T, T]``; ``causal=True``
    adds the lower-triangular mask. The normalizer decides where the mask goes (MultiMax adds it
    after its modulator).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        normalizer: nn.Module,
        *,
        num_kv_heads: int | None = None,
        causal: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        if num_heads % kv_heads != 0:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = kv_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, kv_heads * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.normalizer = normalizer

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        """Self-attention of ``x [B, T, E]`` -> ``[B, T, E]``; ``attn_mask`` is additive and broadcastable to [B, H, T,
        T] (with ``causal`` the lower-triangular mask is added)."""
        b, t, e = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if self.num_kv_heads != self.num_heads:
            groups = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        mask = attn_mask
        if self.causal:
            causal = torch.full((t, t), float("-inf"), dtype=scores.dtype, device=x.device).triu(1)
            mask = causal if mask is None else mask + causal
        weights = self.normalizer(scores, mask)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(b, t, e)
        return self.out_proj(out)


class SoftpickAttention(SoftAttention):
    """Self-attention with Softpick weights: ``O = Softpick(Q K^T scale + mask) V`` (rows of the
    weights need not sum to 1; keys with ``score <= 0`` get exactly 0 -- no attention sink).

    One fused ``SoftpickAttention`` op (docs/ops/SoftpickAttention.md): grouped key/value heads are passed as they are (no
    repeat), ``attn_mask`` as the op's additive Mask, ``causal`` as its attribute; the export is one
    com.softdeploy node whose kernel never materialises the ``[T, T]`` scores."""

    def __init__(self, embed_dim: int, num_heads: int, *, eps: float = 1e-6, **kwargs: Any) -> None:
        super().__init__(embed_dim, num_heads, Softpick(-1, eps), **kwargs)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        b, t, e = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        mask = None if attn_mask is None else attn_mask.to(q.dtype)
        out = _op("SoftpickAttention")(
            q, k, v, mask, scale=self.scale, causal=int(self.causal), eps=self.normalizer.eps
        )
        return self.out_proj(out.transpose(1, 2).reshape(b, t, e))


class MultiMaxAttention(SoftAttention):
    """Self-attention with MultiMax weights: ``O = softmax(sigma(Q K^T scale) + mask) V``."""

    def __init__(self, embed_dim: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(embed_dim, num_heads, MultiMax(-1), **kwargs)


class AdaptiveTemperatureAttention(SoftAttention):
    """Self-attention with adaptive-temperature weights: ``O = softmax(beta(H) S) V``."""

    def __init__(self, embed_dim: int, num_heads: int, **kwargs: Any) -> None:
        super().__init__(embed_dim, num_heads, AdaptiveTemperatureSoftmax(-1), **kwargs)


class SoftmaxFreeAttention(nn.Module):
    """SOFT's softmax-free self-attention (Lu et al., NeurIPS 2021), a CPU port of its Nyström forward.

    Queries and keys share one projection (``K = Q``, SOFT's design); the softmax is replaced by a
    Gaussian kernel and the ``[n, n]`` kernel matrix by its Nyström approximation through ``m`` landmarks::

        Q = x W_q + b_q,  V = x W_v + b_v          (split into H heads of D = E / H)
        L = landmarks(Q)                           [B, H, m, D], m ~ n / ratio**k (see ``landmarks``)
        κ(a, b) = exp(-‖a - b‖² / (2·sqrt(D)))
        K1 = κ(Q, L) [n, m],  K2 = κ(L, L) [m, m],  P = K2 + regularization·I
        V_0 = α P,  α = 1.8 / (max_i Σ_j K2_ij)²,  V_{t+1} = 2 V_t - V_t P V_t   (newton_iters steps)
        O = K1 (V_T (K1ᵀ V))                       right to left: cost and memory linear in n
        out = (O + conv_V(V)) W_o + b_o            conv_V only with ``conv_size`` (SOFT's ``use_conv``)

    ``landmarks``: ``"conv2d"`` is SOFT's: ``Q / D^(1/4)`` laid out on the ``size = (h, w)`` token
    grid, a ``ratio x ratio`` Conv2d of stride ``ratio`` (D -> D channels, no bias, shared by the heads),
    LayerNorm(D), GELU, then scaled back by ``D^(1/4)`` (SOFT scales Q by ``D^(-1/4)`` and uses
    ``exp(-‖·‖²/2)``; the op takes the unscaled Q, so the landmarks are mapped back to Q's space);
    ``m = (h // ratio)(w // ratio)``. ``"conv1d"`` is the same over the sequence (a Conv1d of width and stride
    ``ratio``, no grid needed; ``m = n // ratio``). ``"pool"``: the mean of each run of ``ratio`` consecutive
    queries (``m = n // ratio``, no parameters). Trailing tokens that do not fill a window are not pooled
    (as SOFT's strided conv); ``m = 0`` is refused. ``m`` follows ``n / ratio`` (SOFT fixes one grid per
    stage): the attention costs ``O(n m D)``, linear in ``n`` for a fixed ``m`` (a ratio chosen per length).

    The attention itself is one ``torch.ops.softdeploy.nystrom_gaussian_attention`` call
    (docs/ops/NystromGaussianAttention.md), so :func:`softdeploy.export` gives standard ONNX ops for the
    projections and landmarks plus one ``NystromGaussianAttention`` node whose kernel never forms ``[n, n]``.
    Weights of SOFT's released models load with :func:`load_soft_attention`.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        ratio: int = 2,
        landmarks: str = "conv1d",
        conv_size: int = 0,
        newton_iters: int = 20,
        regularization: float = 0.01,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ArgumentError(
                f"SoftmaxFreeAttention: embed_dim {embed_dim} is not divisible by num_heads {num_heads}"
            )
        if landmarks not in _SOFT_LANDMARKS:
            raise ArgumentError(
                f"SoftmaxFreeAttention: landmarks {landmarks!r} is not one of {', '.join(map(repr, _SOFT_LANDMARKS))}"
            )
        if ratio < 1:
            raise ArgumentError(f"SoftmaxFreeAttention: ratio {ratio} must be >= 1")
        if conv_size < 0 or (conv_size and conv_size % 2 == 0):
            # SOFT pads by conv_size // 2: only an odd size keeps the grid, so the term adds to O
            raise ArgumentError(f"SoftmaxFreeAttention: conv_size {conv_size} must be 0 (off) or odd")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.ratio = ratio
        self.landmarks = landmarks
        self.conv_size = conv_size
        self.newton_iters = newton_iters
        self.regularization = regularization
        d = self.head_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.landmark_proj: nn.Module | None = None
        self.landmark_norm: nn.LayerNorm | None = None
        if landmarks == "conv2d":
            self.landmark_proj = nn.Conv2d(d, d, kernel_size=ratio, stride=ratio, bias=False)
        elif landmarks == "conv1d":
            self.landmark_proj = nn.Conv1d(d, d, kernel_size=ratio, stride=ratio, bias=False)
        if self.landmark_proj is not None:
            self.landmark_norm = nn.LayerNorm(d, eps=layer_norm_eps)
        self.v_conv = (
            nn.Conv2d(num_heads, num_heads, conv_size, padding=conv_size // 2, groups=num_heads, bias=False)
            if conv_size
            else None
        )
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def _grid(self, size: tuple[int, int] | None, n: int) -> tuple[int, int]:
        if size is None:
            raise InputError(
                f"SoftmaxFreeAttention: landmarks={self.landmarks!r} / conv_size={self.conv_size} need the token "
                "grid: call forward(x, size=(h, w)) with h * w = n"
            )
        h, w = size
        if h * w != n:
            raise InputError(f"SoftmaxFreeAttention: size {tuple(size)} has {h * w} cells but x has n={n} tokens")
        return h, w

    def landmark_points(self, q: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        """The landmarks ``L [B, H, m, D]`` of queries ``q [B, H, n, D]``, in Q's space (see the class docstring)."""
        b, h, n, d = q.shape
        r = self.ratio
        if self.landmarks == "pool":
            if n < r:
                raise InputError(f"SoftmaxFreeAttention: n={n} tokens give no landmark at ratio {r} (rule: n >= ratio)")
            x = q.reshape(b * h, n, d).transpose(1, 2)
            return nn.functional.avg_pool1d(x, r, r).transpose(1, 2).reshape(b, h, -1, d)
        assert self.landmark_proj is not None and self.landmark_norm is not None
        # SOFT divides Q by D^(1/4) before its landmark conv and LayerNorm (its kernel is exp(-|a-b|^2 / 2)
        # of the scaled vectors); the same order here, then back to Q's space for the op.
        s = d**0.25
        qs = q / s
        if self.landmarks == "conv2d":
            gh, gw = self._grid(size, n)
            if gh < r or gw < r:
                raise InputError(f"SoftmaxFreeAttention: grid {(gh, gw)} gives no landmark at ratio {r}")
            y = self.landmark_proj(qs.reshape(b * h, gh, gw, d).permute(0, 3, 1, 2)).flatten(2)
        else:
            if n < r:
                raise InputError(f"SoftmaxFreeAttention: n={n} tokens give no landmark at ratio {r} (rule: n >= ratio)")
            y = self.landmark_proj(qs.reshape(b * h, n, d).transpose(1, 2))
        y = y.transpose(1, 2).reshape(b, h, -1, d)
        return nn.functional.gelu(self.landmark_norm(y)) * s

    def forward(self, x: Tensor, size: tuple[int, int] | None = None) -> Tensor:
        """SOFT attention of ``x [B, n, E]`` -> ``[B, n, E]``; ``size = (h, w)`` is the token grid (``h * w = n``),
        needed by ``landmarks="conv2d"`` and by ``conv_size``."""
        b, n, e = x.shape
        hd, d = self.num_heads, self.head_dim
        q = self.q_proj(x).view(b, n, hd, d).transpose(1, 2)
        v = self.v_proj(x).view(b, n, hd, d).transpose(1, 2)
        lm = self.landmark_points(q, size)
        o = _op("NystromGaussianAttention")(
            q, v, lm, newton_iters=self.newton_iters, regularization=self.regularization
        )
        if self.v_conv is not None:
            gh, gw = self._grid(size, n)
            # SOFT's use_conv: a depthwise conv over the heads of V on the grid, one channel map per
            # feature (V [B, H, n, D] -> [B D, H, h, w]), added to the attention output.
            vg = v.reshape(b, hd, gh, gw, d).permute(0, 4, 1, 2, 3).reshape(b * d, hd, gh, gw)
            o = o + self.v_conv(vg).reshape(b, d, hd, gh, gw).flatten(3).permute(0, 2, 3, 1)
        return self.out_proj(o.transpose(1, 2).reshape(b, n, e))


_SOFT_LANDMARKS = ("conv2d", "conv1d", "pool")
# SOFT's SoftmaxFreeAttention (models/softmax_free_transformer.py of fudan-zvg/SOFT, the module at
# ``block{1,2,3}.{i}.att.mha`` of its released vision models) -> this module's names.
_SOFT_KEYS = {
    "W_q.weight": "q_proj.weight",
    "W_q.bias": "q_proj.bias",
    "W_v.weight": "v_proj.weight",
    "W_v.bias": "v_proj.bias",
    "attn.Qlandmark_op.weight": "landmark_proj.weight",
    "attn.Qnorm_act.0.weight": "landmark_norm.weight",
    "attn.Qnorm_act.0.bias": "landmark_norm.bias",
    "ff.weight": "out_proj.weight",
    "ff.bias": "out_proj.bias",
}
_SOFT_OPTIONAL = {"attn.conv.weight": "v_conv.weight"}


def _read_weights(source: Any, prefix: str = "") -> tuple[dict[str, Tensor], str, list[str]]:
    """The tensors under ``prefix`` of a mapping, a ``.safetensors`` file or a ``torch.save`` file (weights_only: never
    unpickled objects; a training checkpoint's ``"model"`` / ``"state_dict"`` entry is used when present), how to
    name the source in messages and the first keys of the whole source.

    Nothing is taken that the file does not hold: a safetensors header is checked (repeated names, offsets, empty
    dimensions) before any tensor is read, a torch file's archive members must be stored uncompressed within the
    file, and a file's tensors must be stored in full (no expanded, zero-stride views: a few bytes posing as a huge
    matrix). Empty dimensions and non-finite values are refused from any source."""
    from collections.abc import Mapping
    from pathlib import Path

    from_file = not isinstance(source, Mapping)
    if not from_file:
        sd: Any = source
        where = "the state dict"
    else:
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise WeightsError(f"load_soft_attention: {path} is not a file")
        if path.suffix == ".safetensors":
            from softdeploy.safetensors_check import load_tensors, read_header

            header = read_header(path, WeightsError)
            names = [k for k in header.tensors if k.startswith(prefix)]
            return load_tensors(header, WeightsError, names), where, sorted(header.tensors)[:8]
        _check_torch_archive(path)
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError, ... by cause
            raise WeightsError(
                f"load_soft_attention: {path} cannot be read with torch.load(weights_only=True): {err}"
            ) from err
        for wrapper in ("model", "state_dict"):
            if isinstance(sd, Mapping) and isinstance(sd.get(wrapper), Mapping):
                sd = sd[wrapper]
                break
    if not isinstance(sd, Mapping) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise WeightsError(f"load_soft_attention: {where}: the weights are not a mapping of names to tensors")
    out = {k: v for k, v in sd.items() if isinstance(k, str) and k.startswith(prefix)}
    from softdeploy.safetensors_check import check_finite

    for k, t in out.items():
        stored = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        # only a file's tensors: a caller's own state dict may hold views, whose memory the caller already has
        if from_file and t.numel() * t.element_size() > stored:
            raise WeightsError(
                f"load_soft_attention: {where}: tensor {k!r} has shape {list(t.shape)} (strides {list(t.stride())}) "
                f"but {stored} bytes of data (rule: every tensor is stored in full, not as an expanded view)"
            )
        if 0 in t.shape:
            raise WeightsError(
                f"load_soft_attention: {where}: tensor {k!r} has shape {list(t.shape)} with a dimension of size 0 "
                "(rule: no empty tensors)"
            )
        check_finite(where, k, t, WeightsError)
    return out, where, sorted(map(str, sd))[:8]


def _check_torch_archive(path: Any) -> None:
    """Refuses a ``torch.save`` file whose reading could allocate more than the file holds: not a zip archive (the
    legacy format declares storage sizes that torch allocates before reading them), or a member stored compressed
    (its declared size is allocated before it is inflated)."""
    import zipfile

    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
    except (zipfile.BadZipFile, OSError) as err:
        raise WeightsError(
            f"load_soft_attention: {path} is not a zip archive as torch.save writes since torch 1.6 ({err}) "
            "(rule: .safetensors, or torch.save's zip format; re-save the weights with a current torch)"
        ) from None
    for m in members:
        if m.compress_type != zipfile.ZIP_STORED or m.file_size > size:
            raise WeightsError(
                f"load_soft_attention: {path}: archive member {m.filename!r} is compressed or larger than the file "
                f"({m.file_size} bytes declared, the file holds {size}) (rule: torch.save stores members "
                "uncompressed)"
            )


def load_soft_attention(
    source: Any,
    *,
    prefix: str = "",
    newton_iters: int = 20,
    regularization: float = 0.01,
    layer_norm_eps: float = 1e-5,
) -> SoftmaxFreeAttention:
    """A :class:`SoftmaxFreeAttention` holding the weights of one SOFT attention module (SOFT's layout).

    ``source``: a state dict, a ``.safetensors`` file or a ``torch.save`` file read with
    ``weights_only=True`` (a checkpoint's ``"model"`` / ``"state_dict"`` entry is used if present). ``prefix``
    selects one module of a whole model (``"block3.0.att.mha."`` in SOFT's vision models); only the keys under
    it are read, and all of them must be SOFT's ``SoftmaxFreeAttention`` keys: ``W_q``, ``W_v`` and ``ff``
    (weight, bias), ``attn.Qlandmark_op.weight`` ``[D, D, r, r]`` (the landmark Conv2d; gives D, the heads
    ``E / D`` and ``ratio = r``), ``attn.Qnorm_act.0`` (LayerNorm weight, bias) and optionally
    ``attn.conv.weight`` ``[H, 1, k, k]`` (``conv_size = k``). The module uses ``landmarks="conv2d"``, so its
    forward needs the token grid ``size=(h, w)``. ``newton_iters`` (SOFT's ``max_iter``) and the LayerNorm eps
    are not stored in the weights; the defaults are SOFT's. SOFT's ``ratio == 1`` layout (a Linear instead of
    the conv: exact kernel attention over every token, not Nyström) is refused.

    Raises :class:`~softdeploy.errors.WeightsError` naming missing / unexpected keys and wrong shapes.
    """
    sub, where, keys = _read_weights(source, prefix)
    sub = {k[len(prefix) :]: v for k, v in sub.items()}
    if not sub:
        raise WeightsError(f"load_soft_attention: {where}: no key starts with prefix {prefix!r} (keys: {keys} ...)")
    known = set(_SOFT_KEYS) | set(_SOFT_OPTIONAL)
    missing = sorted(set(_SOFT_KEYS) - set(sub))
    extra = sorted(set(sub) - known)
    if missing or extra:
        raise WeightsError(
            f"load_soft_attention: {where}: not SOFT's SoftmaxFreeAttention layout under prefix {prefix!r}: "
            f"missing keys {[prefix + k for k in missing]}, unexpected keys {[prefix + k for k in extra]}"
        )
    wq = sub["W_q.weight"]
    lw = sub["attn.Qlandmark_op.weight"]
    if wq.dim() != 2 or wq.shape[0] != wq.shape[1]:
        raise WeightsError(f"load_soft_attention: {where}: {prefix}W_q.weight has shape {list(wq.shape)}, want [E, E]")
    if lw.dim() != 4 or lw.shape[0] != lw.shape[1] or lw.shape[2] != lw.shape[3]:
        hint = " (SOFT's ratio-1 Linear layout is not supported)" if lw.dim() == 2 else ""
        raise WeightsError(
            f"load_soft_attention: {where}: {prefix}attn.Qlandmark_op.weight has shape {list(lw.shape)}, "
            f"want [D, D, r, r]{hint}"
        )
    e, d, r = wq.shape[0], lw.shape[0], lw.shape[2]
    if r < 2 or e % d != 0:
        raise WeightsError(
            f"load_soft_attention: {where}: {prefix}attn.Qlandmark_op.weight {list(lw.shape)} does not fit E={e} "
            "(rule: D divides E, ratio r >= 2)"
        )
    heads = e // d
    conv = sub.get("attn.conv.weight")
    k = 0
    if conv is not None:
        k = conv.shape[-1] if conv.dim() == 4 else 0
        if conv.dim() != 4 or list(conv.shape) != [heads, 1, k, k] or k % 2 == 0:
            raise WeightsError(
                f"load_soft_attention: {where}: {prefix}attn.conv.weight has shape {list(conv.shape)}, "
                f"want [{heads}, 1, k, k] with k odd"
            )
    # every shape the module would allocate follows from E, D, r and k; all are checked against the tensors present
    # before the module exists, so it is never larger than the weights the file actually holds
    want = {
        "W_q.weight": [e, e],
        "W_q.bias": [e],
        "W_v.weight": [e, e],
        "W_v.bias": [e],
        "attn.Qlandmark_op.weight": [d, d, r, r],
        "attn.Qnorm_act.0.weight": [d],
        "attn.Qnorm_act.0.bias": [d],
        "ff.weight": [e, e],
        "ff.bias": [e],
        "attn.conv.weight": [heads, 1, k, k],
    }
    bad = [f"{prefix}{k_}: {list(t.shape)} (want {want[k_]})" for k_, t in sub.items() if list(t.shape) != want[k_]]
    if bad:
        raise WeightsError(f"load_soft_attention: {where}: wrong shapes: {'; '.join(sorted(bad))}")
    floats = [f"{prefix}{k_} ({t.dtype})" for k_, t in sub.items() if not t.is_floating_point()]
    if floats:
        raise WeightsError(
            f"load_soft_attention: {where}: {', '.join(sorted(floats))} (rule: weights are floating point)"
        )
    module = SoftmaxFreeAttention(
        e,
        heads,
        ratio=r,
        landmarks="conv2d",
        conv_size=k,
        newton_iters=newton_iters,
        regularization=regularization,
        layer_norm_eps=layer_norm_eps,
    )
    names = {**_SOFT_KEYS, **_SOFT_OPTIONAL}
    module.load_state_dict({names[k_]: t.to(torch.float32) for k_, t in sub.items()})
    return module


# ---- heads ---------------------------------------------------------------------------------------


class NormalizedHead(nn.Module):
    """``y = normalizer(x W^T + b)`` over the class axis: a classifier / LM head."""

    def __init__(self, in_features: int, num_classes: int, normalizer: nn.Module, *, bias: bool = True) -> None:
        super().__init__()
        self.proj = nn.Linear(in_features, num_classes, bias=bias)
        self.normalizer = normalizer

    def forward(self, x: Tensor) -> Tensor:
        """normalizer(x W^T + b): class weights over the last axis."""
        return self.normalizer(self.proj(x))


class SoftpickHead(NormalizedHead):
    """``Softpick(x W^T + b)``."""

    def __init__(self, in_features: int, num_classes: int, *, eps: float = 1e-6, bias: bool = True) -> None:
        super().__init__(in_features, num_classes, Softpick(-1, eps), bias=bias)


class MultiMaxHead(NormalizedHead):
    """``MultiMax(x W^T + b)`` (the paper's classifier placement: modulator, then softmax)."""

    def __init__(self, in_features: int, num_classes: int, *, bias: bool = True) -> None:
        super().__init__(in_features, num_classes, MultiMax(-1), bias=bias)


class AdaptiveTemperatureHead(NormalizedHead):
    """``AdaptiveTemperatureSoftmax(x W^T + b)``."""

    def __init__(self, in_features: int, num_classes: int, *, bias: bool = True) -> None:
        super().__init__(in_features, num_classes, AdaptiveTemperatureSoftmax(-1), bias=bias)


class SoftmaxTopKHead(nn.Module):
    """The k most probable classes: ``TopK(softmax((x W^T + b) / temperature), k)``.

    Returns ``(values [..., k], indices [..., k] int64)``, probabilities in descending order, ties to
    the lower index. One fused op: the probability row is never materialised.
    """

    def __init__(
        self, in_features: int, num_classes: int, k: int, *, temperature: float = 1.0, bias: bool = True
    ) -> None:
        super().__init__()
        if not 1 <= k <= num_classes:
            raise ValueError(f"k={k} must satisfy 1 <= k <= num_classes={num_classes}")
        self.proj = nn.Linear(in_features, num_classes, bias=bias)
        self.k = k
        self.temperature = temperature

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(values [..., k], indices [..., k] int64) of the k most probable classes of x."""
        values, indices, _ = _op("SoftmaxTopK")(self.proj(x), k=self.k, axis=-1, temperature=self.temperature)
        return values, indices


# ---- soft thinking -------------------------------------------------------------------------------


def soft_token_embedding(
    logits: Tensor, embedding: Tensor, uniform: Tensor | None = None, mode: Tensor | None = None, **attrs: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The SoftTokenEmbedding op (docs/ops/SoftTokenEmbedding.md) on torch tensors: ``(mixed [B, E], weights
    [B, max_topk], ids [B, max_topk] int64, entropy [B])`` of ``logits [B, V]`` over ``embedding [V, E]``;
    ``uniform [B, V]`` in (0, 1) (the op's Noise input, read by ``noise="gumbel"``), ``mode [B]`` int64 (0 thinking, 1 after
    thinking). ``attrs`` are the op's attributes (temperature, top_k, top_p, min_p, max_topk, noise, tau,
    noise_factor, clamp_min, clamp_max, after_thinking_*)."""
    return _op("SoftTokenEmbedding")(logits, embedding, uniform, mode, **attrs)


class SoftTokenEmbedding(nn.Module):
    """Soft thinking's next input embedding (Soft Thinking; SofT-GRPO): from next-token ``logits [B, V]``, the
    mixture ``sum_k w_k E[id_k]`` of the ``max_topk`` most probable tokens' embeddings after temperature, top-k /
    top-p / min-p filtering and optional Gumbel noise; rows with ``mode`` 1 (after thinking) use the
    ``after_thinking_*`` filters and no noise. Returns ``(mixed [B, E], weights [B, max_topk], ids [B, max_topk]
    int64, entropy [B])``; the equations, tie and special-value rules are the SoftTokenEmbedding op's.

    ``embedding`` is the model's input embedding table ``[V, E]`` (an ``nn.Embedding`` or its weight), shared,
    not copied. Exported, the module is one ``com.softdeploy`` SoftTokenEmbedding node.
    """

    def __init__(
        self,
        embedding: nn.Embedding | Tensor,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        max_topk: int = 10,
        noise: str = "none",
        tau: float = 1.0,
        noise_factor: float = 1.0,
        clamp_min: float = -1.5,
        clamp_max: float = 3.0,
        after_thinking_temperature: float = 1.0,
        after_thinking_top_k: int = 0,
        after_thinking_top_p: float = 1.0,
        after_thinking_min_p: float = 0.0,
    ) -> None:
        super().__init__()
        from softdeploy.ops import soft_token_embedding as op_module

        weight = embedding.weight if isinstance(embedding, nn.Embedding) else embedding
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise ArgumentError(
                f"SoftTokenEmbedding: embedding must be a [V, E] tensor or nn.Embedding, got {weight!r}"
            )
        self.attrs: dict[str, Any] = {
            "temperature": temperature,
            "top_k": top_k,
            "top_p": top_p,
            "min_p": min_p,
            "max_topk": max_topk,
            "noise": noise,
            "tau": tau,
            "noise_factor": noise_factor,
            "clamp_min": clamp_min,
            "clamp_max": clamp_max,
            "after_thinking_temperature": after_thinking_temperature,
            "after_thinking_top_k": after_thinking_top_k,
            "after_thinking_top_p": after_thinking_top_p,
            "after_thinking_min_p": after_thinking_min_p,
        }
        # The attribute rules now, not at the first step (the Noise and Mode rules need the inputs).
        v = weight.shape[0]
        op_module.validate((1, v), tuple(weight.shape), (1, v), None, op_module.DEF.resolve_attrs(self.attrs))
        if isinstance(weight, nn.Parameter):
            self.weight = weight  # registered: shared with the model's embedding, exported once
        else:
            self.register_buffer("weight", weight, persistent=False)

    def forward(
        self, logits: Tensor, uniform: Tensor | None = None, mode: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(mixed [B, E], weights [B, max_topk], ids [B, max_topk] int64, entropy [B]) of ``logits [B, V]``;
        ``uniform [B, V]`` in (0, 1) (Noise) for ``noise="gumbel"``, ``mode [B]`` int64 (0 thinking, 1 after)."""
        return soft_token_embedding(logits, self.weight, uniform, mode, **self.attrs)


# ---- retrieval -----------------------------------------------------------------------------------


class MaxSimScorer(nn.Module):
    """Late-interaction (ColBERT) relevance: ``score[b, n] = sum_{i valid} max_{j valid} <q_bi, d_nj>``.

    ``queries [B, Lq, dim]``, ``documents [N, Ld, dim]``; optional bool masks ``[B, Lq]`` /
    ``[N, Ld]`` (True = a real token). Masked document tokens are excluded from the max, masked query
    tokens contribute 0. ``normalize=True`` L2-normalises both sides first (cosine similarity).
    """

    def __init__(self, *, normalize: bool = False) -> None:
        super().__init__()
        self.normalize = normalize

    def forward(
        self,
        queries: Tensor,
        documents: Tensor,
        query_mask: Tensor | None = None,
        document_mask: Tensor | None = None,
    ) -> Tensor:
        """Scores [B, N] of queries [B, Lq, dim] against documents [N, Ld, dim] (masks: True = a real token)."""
        if self.normalize:
            queries = nn.functional.normalize(queries, dim=-1)
            documents = nn.functional.normalize(documents, dim=-1)
        return _op("MaxSim")(queries, documents, query_mask, document_mask)


class SignedMaxSimScorer(nn.Module):
    """Signed late interaction: the match ``j*`` is chosen on magnitude, the sign multiplies in.

    ``score[b, n] = sum_i q_sign[b, i] d_sign[n, j*] <q_bi, d_nj*>``,
    ``j* = argmax_{valid j} <q_bi, d_nj>`` (ties to the lowest j).
    """

    def forward(
        self,
        queries: Tensor,
        query_signs: Tensor,
        documents: Tensor,
        document_signs: Tensor,
        query_mask: Tensor | None = None,
        document_mask: Tensor | None = None,
    ) -> Tensor:
        """Scores [B, N]: queries [B, Lq, dim] with signs [B, Lq] against documents [N, Ld, dim] with signs [N, Ld]
        (masks: True = a real token)."""
        return _op("SignedMaxSim")(queries, query_signs, documents, document_signs, query_mask, document_mask)


# ---- detection -----------------------------------------------------------------------------------


class SoftNMS(nn.Module):
    """Soft non-maximum suppression (Bodla et al. 2017), a drop-in for ``NonMaxSuppression``.

    Per (batch, class): repeatedly select the box with the highest current score and decay the
    others by their IoU with it -- ``linear``: ``s <- s (1 - IoU)`` if ``IoU > iou_threshold``;
    ``gaussian``: ``s <- s exp(-IoU^2 / sigma)``; ``hard``: ``s <- 0`` if ``IoU > iou_threshold``
    (classic NMS). Boxes whose score falls below ``score_threshold`` are dropped.
    ``boxes [B, N, 4]``, ``scores [B, C, N]`` ->
    ``(selected [M, 3] int64 rows (batch, class, box), selected_scores [M])`` in selection order.
    ``max_output_boxes_per_class <= 0`` means no limit.
    """

    def __init__(
        self,
        method: str = "linear",
        *,
        sigma: float = 0.5,
        iou_threshold: float = 0.3,
        score_threshold: float = 0.001,
        max_output_boxes_per_class: int = 0,
        center_point_box: int = 0,
        coordinate_offset: int = 0,
    ) -> None:
        super().__init__()
        if method not in ("linear", "gaussian", "hard"):
            raise ValueError(f"SoftNMS: method {method!r} is not one of 'linear', 'gaussian', 'hard'")
        self.method = method
        self.sigma = sigma
        self.center_point_box = center_point_box
        self.coordinate_offset = coordinate_offset
        # Buffers, so export turns them into initializers of the node's optional scalar inputs.
        self.register_buffer("max_output_boxes_per_class", torch.tensor([max_output_boxes_per_class]))
        self.register_buffer("iou_threshold", torch.tensor([iou_threshold], dtype=torch.float32))
        self.register_buffer("score_threshold", torch.tensor([score_threshold], dtype=torch.float32))

    def forward(self, boxes: Tensor, scores: Tensor) -> tuple[Tensor, Tensor]:
        """(selected [M, 3] int64 (batch, class, box), selected_scores [M]) for boxes [B, N, 4] and scores [B, C, N], in
        selection order."""
        selected, selected_scores = _op("SoftNMS")(
            boxes,
            scores,
            self.max_output_boxes_per_class,
            self.iou_threshold,
            self.score_threshold,
            method=self.method,
            sigma=self.sigma,
            center_point_box=self.center_point_box,
            coordinate_offset=self.coordinate_offset,
        )
        return selected, selected_scores


__all__ = [
    "AdaptiveTemperatureAttention",
    "AdaptiveTemperatureHead",
    "AdaptiveTemperatureSoftmax",
    "MaxSimScorer",
    "MultiMax",
    "MultiMaxAttention",
    "MultiMaxHead",
    "NormalizedHead",
    "SignedMaxSimScorer",
    "SoftAttention",
    "SoftNMS",
    "SoftTokenEmbedding",
    "SoftmaxFreeAttention",
    "SoftmaxTopKHead",
    "Softpick",
    "SoftpickAttention",
    "SoftpickHead",
    "TwoPassSoftmax",
    "load_soft_attention",
    "soft_token_embedding",
]
