"""The opt-in TVM variants of ``softdeploy compare`` on the tiny model (a com.softdeploy op inside)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tvm", reason="the TVM backend is optional: pip install 'softdeploy[tvm]'")

from compare.tiny_case import TinyCase
from softdeploy.compare import REFERENCE, VARIANTS, run_compare
from softdeploy.compare.runner import TVM_VARIANTS, known_variants
from softdeploy.progress import SilentProgress

pytestmark = pytest.mark.tvm  # for `-m` selection; without the `tvm` extra the module skips at import


def test_tvm_variants_are_opt_in_and_known() -> None:
    assert not set(TVM_VARIANTS) & set(VARIANTS)  # the default set stays as it was
    assert set(TVM_VARIANTS) <= set(known_variants())


def test_tvm_variants_agree_with_the_reference(tmp_path: Path) -> None:
    r = run_compare(
        TinyCase(),
        tmp_path,
        variants=["tvm-fp32", "tvm-fp32-untuned"],
        threads=1,
        rounds=1,
        round_seconds=0.0,
        progress=SilentProgress(),
    )
    rows = {row["variant"]: row for row in r.rows()}
    assert list(rows) == [REFERENCE, "tvm-fp32", "tvm-fp32-untuned"]
    for name in TVM_VARIANTS:
        assert rows[name]["output cosine"] > 0.99999
        assert rows[name]["infer p50 ms"] > 0
