"""Hypothesis strategies for the fuzz cases of tests/reliability/fuzzing.py."""

from __future__ import annotations

from hypothesis import strategies as st

from reliability.fuzzing import FLOAT_ATTRS, INT_ATTRS, SIZES, STR_ATTRS, Case, Keep, build_case, dim_groups, templates
from softdeploy.ops import OpDef

_BY_KIND = {int: st.sampled_from(INT_ATTRS), float: st.sampled_from(FLOAT_ATTRS), str: st.sampled_from(STR_ATTRS)}
# How many special values an input gets: mostly none or a few, sometimes every entry.
_SPECIAL_COUNTS = st.sampled_from((0, 0, 0, 1, 1, 2, 3, 8, -1))


@st.composite
def cases(draw: st.DrawFn, op: OpDef) -> Case:
    """A fuzz case of ``op`` (see fuzzing.build_case)."""
    ts = templates(op.name)
    ti = draw(st.integers(0, len(ts) - 1), label="template")
    groups = sorted(dim_groups(ts[ti]))
    resize_one = st.one_of(st.none(), st.none(), st.sampled_from(SIZES))
    resize = draw(st.lists(resize_one, min_size=len(groups), max_size=len(groups)), label="resize")
    attrs = [draw(st.one_of(*[st.builds(Keep)] * 3, _BY_KIND[a.kind]), label=f"attr {a.name}") for a in op.attrs]
    return build_case(
        op,
        ti,
        draw(st.integers(0, 2), label="dtype"),
        resize,
        draw(st.booleans(), label="keep values"),
        draw(st.integers(0, 2**32 - 1), label="seed"),
        draw(st.lists(_SPECIAL_COUNTS, min_size=len(op.inputs), max_size=len(op.inputs)), label="specials"),
        attrs,
    )
