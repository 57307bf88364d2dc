"""Op-agnostic fuzz cases for every op of softdeploy.ops.REGISTRY (no op lists here).

A case starts from one of the op's own samples (its *template*: the op module knows which shapes and
values are meaningful) and mutates it:

* shapes: the template's dims are grouped by size (dims of equal size are assumed tied, e.g. MaxSim's
  ``dim`` in Q and D, SoftNMS's N in Boxes and Scores), and each group may be resized as one -- so a
  resized case mostly stays valid, and a group that is not really tied (``Ranges [4]`` and a row of 4)
  gives a case the op must refuse;
* values: resized inputs are re-drawn from the template's own finite values (signs stay in [-1, 1],
  boxes stay boxes), then special values (+-inf, NaN, -0, denormals, finfo min/max, the Hugging Face
  additive mask finfo(float32).min, ...) are written at random positions of the float inputs;
* attributes: in-range and out-of-range values of the declared kind (int, float, str).

The float64 reference (op.reference) is the judge: what it refuses with OpContractError the kernel
must refuse with an OpContractError naming the op; what it accepts the kernel must reproduce within
the op's declared tolerance (op.tolerance), NaN in the same places.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from softdeploy import conformance
from softdeploy.ops import REGISTRY, OpDef, Sample

# Sizes a resized dim group may take: empty, one, and the SIMD tile / summation block edges of the
# kernels (8/16-lane vectors, 48/64-entry unrolled steps, 512/1024-entry blocks).
SIZES = (0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 49, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025)
# Bound on the elements of any one input of a fuzz case: keeps a case (reference + kernel on every ISA)
# at a few milliseconds. Big shapes are the conformance samples' and the concurrency tests' job.
MAX_ELEMENTS = 1 << 15
# Bound on the arithmetic of one case where it grows faster than the inputs: NystromGaussianAttention's
# Newton-Schulz steps cost ~4 m^3 per head (m landmarks), so Landmarks of 1023 x 32 elements (within
# MAX_ELEMENTS) is ~1e11 flops: minutes for the portable variant under ASan (.ci/sanitize) for one case.
# heads * m^3 <= MAX_CUBIC_WORK keeps m up to 256 for one head; larger m are the conformance samples' job.
MAX_CUBIC_WORK = 1 << 24
CUBIC_DIM = {"NystromGaussianAttention": 2}  # op -> the input whose axis -2 is m (Landmarks [B, H, m, d])
# Templates larger than this are not used as they are: their groups are shrunk into MAX_ELEMENTS.
HUGE = 2**40  # huge-but-empty dims: 2**40 rows of nothing must cost nothing


# Factors the magnitude fuzz scales an op's linear input by (OpDef.linear_in, attention's V: O(c V) =
# c O(V)), from below 1 to far beyond float16's range: a float32 kernel's absolute error grows with |V|, and
# the tolerance must follow (OpDef.atol_scale) -- a fixed atol was missed once V was scaled by 3.7 (Nystrom)
# or |V| reached ~30 (Softpick attention).
MAGNITUDES = (1e-3, 1.0, 3.7, 30.0, 1e3, 1e6, 1e20)


def scale_linear_input(case: Case, factor: float) -> Case:
    """``case`` with its op's linear input (OpDef.linear_in) multiplied by ``factor`` in its own element
    type (beyond float16's range: +-inf, whose rules the op has too); unchanged for ops without one."""
    op = REGISTRY[case.op]
    if op.linear_in is None:
        return case
    index = [p.name for p in op.inputs].index(op.linear_in)
    inputs = list(case.sample.inputs)
    value = inputs[index]
    if value is None or np.asarray(value).dtype.kind != "f":
        return case
    with np.errstate(over="ignore"):
        inputs[index] = (np.asarray(value, np.float64) * factor).astype(np.asarray(value).dtype)
    sample = dataclasses.replace(case.sample, inputs=tuple(inputs))
    return dataclasses.replace(case, sample=sample, mutations=(*case.mutations, f"{op.linear_in} x{factor:g}"))


def specials(dtype: np.dtype) -> tuple[float, ...]:
    """The special values written into float inputs of ``dtype``."""
    f = np.finfo(dtype)
    f32 = np.finfo(np.float32)
    values = [
        math.inf,
        -math.inf,
        math.nan,
        -0.0,
        0.0,
        float(f.smallest_subnormal),
        -float(f.smallest_subnormal),
        float(f.tiny) / 4,  # a denormal that is not the smallest
        float(f.tiny),
        float(f.min),
        float(f.max),
        float(f32.min),  # the Hugging Face additive attention mask (overflows float16 to -inf)
        1e4,
        -1e4,
        1e20,
        -1e20,
        1.0,
        -1.0,
    ]
    return tuple(values)


INT_ATTRS = (-(2**31), -(2**40), -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 2**31 - 1, 2**40)
# float32-exact values (ONNX float attributes are float32; the reference takes the Python float).
FLOAT_ATTRS = (
    0.0,
    -0.0,
    -1.0,
    -0.5,
    2.0**-100,
    2.0**-27,
    0.375,
    0.5,
    1.0,
    2.0,
    7.0,
    1024.0,
    2.0**100,
    float(np.finfo(np.float32).max),
    math.inf,
    -math.inf,
    math.nan,
)
STR_ATTRS = ("linear", "gaussian", "hard", "", "cubic", "LINEAR", "linear ")


@functools.cache
def templates(name: str) -> tuple[Sample, ...]:
    return tuple(REGISTRY[name].samples(np.random.default_rng(0)))


def dtypes_of(op: OpDef, template: Sample) -> list[str]:
    """The "T" element types the template can be written in (int8 templates stay int8)."""
    return [t for t in op.float_types if conformance.cast_sample(op, template, t) is not None]


def dim_groups(template: Sample) -> dict[int, list[tuple[int, int]]]:
    """size -> [(input index, axis)] of every dim of the template's inputs with that size."""
    groups: dict[int, list[tuple[int, int]]] = {}
    for i, v in enumerate(template.inputs):
        if v is None:
            continue
        for ax, size in enumerate(np.shape(v)):
            groups.setdefault(int(size), []).append((i, ax))
    return groups


def resized_shapes(template: Sample, new_size: dict[int, int], op: str = "") -> list[tuple[int, ...] | None]:
    """Input shapes with each dim of a group whose size is in ``new_size`` replaced, then groups shrunk
    (largest first, to the largest SIZES value that fits) until no input exceeds MAX_ELEMENTS, and op's
    cubic dim (CUBIC_DIM) until the case's heads * m^3 is within MAX_CUBIC_WORK."""
    sizes = {s: new_size.get(s, s) for s in dim_groups(template)}

    def shapes() -> list[tuple[int, ...] | None]:
        return [None if v is None else tuple(sizes[int(d)] for d in np.shape(v)) for v in template.inputs]

    for _ in range(64):
        over = [s for s in shapes() if s is not None and math.prod(s) > MAX_ELEMENTS]
        if not over:
            break
        worst = max(over, key=math.prod)
        big = max(worst)
        old = next(k for k, v in sizes.items() if v == big)
        fit = max(1, MAX_ELEMENTS // max(1, math.prod(worst) // big))
        sizes[old] = max([s for s in SIZES if s <= fit] or [1])
    cubic = CUBIC_DIM.get(op)
    if cubic is not None and template.inputs[cubic] is not None and np.ndim(template.inputs[cubic]) >= 2:
        group = int(np.shape(template.inputs[cubic])[-2])  # m's group: dims keep their template size's key
        for _ in range(8):  # shrinking m's group may shrink the heads too (a shared size): check again
            shape = shapes()[cubic]
            assert shape is not None
            heads, m = math.prod(shape[:-2]), shape[-2]
            if heads * m**3 <= MAX_CUBIC_WORK:
                break
            sizes[group] = max([s for s in SIZES if heads * s**3 <= MAX_CUBIC_WORK] or [1])
    return shapes()


def _port_dtype(op: OpDef, index: int, t_dtype: str, value: Any) -> np.dtype:
    port = op.inputs[index]
    if port.dtype == "T":
        return np.dtype(t_dtype)
    return np.asarray(value).dtype


def redraw(value: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, rng: np.random.Generator) -> np.ndarray:
    """An array of ``shape`` whose entries are drawn from ``value``'s finite entries (its meaningful
    range), or from N(0, 3) / {False, True} / 0..4 when it has none."""
    flat = np.asarray(value).reshape(-1)
    if flat.dtype.kind == "f":
        flat = flat[np.isfinite(flat)]
    if flat.size == 0:
        if dtype == np.bool_:
            flat = np.array([False, True])
        elif dtype.kind == "f":
            flat = rng.standard_normal(64) * 3
        else:
            flat = np.arange(5)
    return rng.choice(flat, size=shape).astype(dtype)


def inject(x: np.ndarray, rng: np.random.Generator, how_many: int) -> np.ndarray:
    """``x`` with ``how_many`` random entries (all when how_many < 0) set to special values."""
    if x.size == 0 or how_many == 0 or x.dtype.kind != "f":
        return x
    x = x.copy()
    flat = x.reshape(-1)
    n = flat.size if how_many < 0 else min(how_many, flat.size)
    pos = rng.choice(flat.size, size=n, replace=False)
    values = np.array(specials(x.dtype), dtype=np.float64)
    with np.errstate(over="ignore"):
        flat[pos] = values[rng.integers(0, len(values), size=n)].astype(x.dtype)
    return x


@dataclasses.dataclass(frozen=True)
class Case:
    """One fuzz case: the sample (inputs and attributes) and where it came from."""

    op: str
    sample: Sample
    dtype: str
    template: str
    mutations: tuple[str, ...]

    def describe(self) -> str:
        parts = []
        for port, v in zip(REGISTRY[self.op].inputs, self.sample.inputs, strict=False):
            if v is None:
                parts.append(f"{port.name}=omitted")
                continue
            a = np.asarray(v)
            desc = f"{port.name}:{a.dtype}{list(a.shape)}"
            if a.size and a.size <= 12:
                desc += "=" + np.array2string(a.reshape(-1), separator=",", max_line_width=10**6)
            elif a.size and a.dtype.kind == "f":
                finite = a[np.isfinite(a)]
                desc += (
                    f"(nan={int(np.isnan(a).sum())},+inf={int((a == np.inf).sum())},-inf={int((a == -np.inf).sum())}"
                    + (f",|max|={float(np.abs(finite).max()):.3g}" if finite.size else "")
                    + ")"
                )
            parts.append(desc)
        return (
            f"{self.op} from {self.template} [{self.dtype}; {', '.join(self.mutations) or 'as is'}]: "
            f"{'; '.join(parts)}; attrs={dict(self.sample.attrs)}"
        )


def build_case(
    op: OpDef,
    template_index: int,
    dtype_index: int,
    resize: Sequence[int | None],
    keep_values: bool,
    seed: int,
    special_counts: Sequence[int],
    attr_choices: Sequence[Any],
) -> Case:
    """A fuzz case from hypothesis' draws (see test_fuzz.py): ``resize[g]`` is the new size of the g-th
    dim group (sorted by size) or None, ``special_counts[i]`` how many special values input i gets
    (-1: all), ``attr_choices[a]`` the value of the a-th attribute (a _Keep() keeps the template's)."""
    template = templates(op.name)[template_index % len(templates(op.name))]
    kinds = dtypes_of(op, template)
    dtype = kinds[dtype_index % len(kinds)]
    cast = conformance.cast_sample(op, template, dtype)
    assert cast is not None
    rng = np.random.default_rng(seed)
    mutations: list[str] = []
    groups = sorted(dim_groups(template))
    new_size = {g: s for g, s in zip(groups, resize, strict=False) if s is not None and s != g}
    shapes = resized_shapes(template, new_size, op.name)
    inputs: list[np.ndarray | None] = []
    for i, (v, shape) in enumerate(zip(cast.inputs, shapes, strict=True)):
        if v is None:
            inputs.append(None)
            continue
        dt = _port_dtype(op, i, dtype, v)
        a = np.asarray(v)
        if shape == a.shape and keep_values:
            new = np.array(a, dtype=dt, copy=True)
        else:
            new = redraw(a, shape, dt, rng)
            change = f"{list(a.shape)}->{list(shape)}" if shape != a.shape else "values redrawn"
            mutations.append(f"{op.inputs[i].name} {change}")
        count = special_counts[i] if i < len(special_counts) else 0
        if count and new.dtype.kind == "f" and new.size:
            new = inject(new, rng, count)
            mutations.append(f"{op.inputs[i].name} specials x{'all' if count < 0 else count}")
        inputs.append(new)
    attrs = dict(template.attrs)
    for a, choice in zip(op.attrs, attr_choices, strict=False):
        if isinstance(choice, Keep):
            continue
        attrs[a.name] = choice
        mutations.append(f"{a.name}={choice!r}")
    name = f"fuzz<{template.name}>"
    return Case(op.name, Sample(name, tuple(inputs), attrs, template.kind), dtype, template.name, tuple(mutations))


class Keep:
    """Attribute draw meaning "the template's value (or the default when it sets none)"."""

    def __repr__(self) -> str:
        return "keep"


def t_dtype(op: OpDef, sample: Sample) -> str:
    for p, v in zip(op.inputs, sample.inputs, strict=False):
        if p.dtype == "T" and v is not None:
            return np.asarray(v).dtype.name
    return "float32"
