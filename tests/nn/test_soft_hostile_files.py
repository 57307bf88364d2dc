"""load_soft_attention on hostile files: tiny files posing as huge modules, empty dimensions, repeated names in a
safetensors header, non-finite weights. Each is a WeightsError naming the file and the tensor, raised before the
module is built; the allocation test runs in a child process under an address-space limit, so a loader that builds
first and checks later fails the test instead of exhausting the machine."""

from __future__ import annotations

import json
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from reliability.memory_limit import load_under_memory_limit
from safetensors.torch import save_file

from softdeploy import nn as sdnn
from softdeploy.errors import WeightsError

E, HEADS, RATIO = 16, 2, 2
D = E // HEADS


def soft_weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "W_q.weight": torch.randn(E, E, generator=g),
        "W_q.bias": torch.randn(E, generator=g),
        "W_v.weight": torch.randn(E, E, generator=g),
        "W_v.bias": torch.randn(E, generator=g),
        "attn.Qlandmark_op.weight": torch.randn(D, D, RATIO, RATIO, generator=g),
        "attn.Qnorm_act.0.weight": torch.ones(D),
        "attn.Qnorm_act.0.bias": torch.zeros(D),
        "ff.weight": torch.randn(E, E, generator=g),
        "ff.bias": torch.randn(E, generator=g),
    }


def huge_views(e: int) -> dict[str, torch.Tensor]:
    """SOFT's layout with E = ``e``: every tensor a zero-stride view of one stored number (torch.save keeps the
    strides, so the file is a few KB whatever ``e`` is)."""
    one = torch.ones(1)
    return {
        "W_q.weight": one.expand(e, e),
        "W_q.bias": one.expand(e),
        "W_v.weight": one.expand(e, e),
        "W_v.bias": one.expand(e),
        "attn.Qlandmark_op.weight": one.expand(e // 2, e // 2, 2, 2),
        "attn.Qnorm_act.0.weight": one.expand(e // 2),
        "attn.Qnorm_act.0.bias": one.expand(e // 2),
        "ff.weight": one.expand(e, e),
        "ff.bias": one.expand(e),
    }


def run_child(path: Path) -> subprocess.CompletedProcess[str]:
    return load_under_memory_limit(
        path,
        imports="import torch\nfrom softdeploy import nn as sdnn\nfrom softdeploy.errors import WeightsError",
        call="sdnn.load_soft_attention",
        error="WeightsError",
    )


def test_tiny_file_of_expanded_tensors_is_refused_before_any_allocation(tmp_path: Path) -> None:
    path = tmp_path / "soft.pth"
    torch.save(huge_views(40_000), path)  # three 40000 x 40000 float32 projections: 19 GB as a module
    assert path.stat().st_size < 8_000
    done = run_child(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{path}: tensor 'W_q.weight' has shape [40000, 40000]" in done.stdout
    assert "rule: every tensor is stored in full" in done.stdout


def test_state_dict_of_the_right_shapes_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "soft.pth"
    torch.save(soft_weights(), path)
    module = sdnn.load_soft_attention(path)
    assert torch.equal(module.q_proj.weight, soft_weights()["W_q.weight"])
    save_file(soft_weights(), str(tmp_path / "soft.safetensors"))
    assert torch.equal(sdnn.load_soft_attention(tmp_path / "soft.safetensors").out_proj.bias, soft_weights()["ff.bias"])


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_empty_dimension_is_refused_naming_file_and_tensor(tmp_path: Path, suffix: str) -> None:
    w = soft_weights()
    # E = 0: every check of D dividing E passes, and the module would have no heads
    w.update({"W_q.weight": torch.zeros(0, 0), "W_v.weight": torch.zeros(0, 0), "ff.weight": torch.zeros(0, 0)})
    path = tmp_path / f"soft{suffix}"
    save_file(w, str(path)) if suffix == ".safetensors" else torch.save(w, path)
    with pytest.raises(WeightsError, match=rf"soft{suffix}: tensor 'W_q.weight' has shape \[0, 0\].*size 0"):
        sdnn.load_soft_attention(path)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_non_finite_weights_are_refused_naming_file_and_tensor(tmp_path: Path, suffix: str) -> None:
    w = soft_weights()
    w["attn.Qnorm_act.0.bias"][3] = float("nan")
    path = tmp_path / f"soft{suffix}"
    save_file(w, str(path)) if suffix == ".safetensors" else torch.save(w, path)
    with pytest.raises(WeightsError, match=rf"soft{suffix}: tensor 'attn.Qnorm_act.0.bias' holds 1 non-finite"):
        sdnn.load_soft_attention(path)


def _safetensors_by_hand(path: Path, entries: list[tuple[str, dict[str, object]]], data: bytes) -> None:
    body = ("{" + ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in entries) + "}").encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)


def _entries(w: dict[str, torch.Tensor]) -> tuple[list[tuple[str, dict[str, object]]], bytes]:
    entries, data = [], b""
    for k, t in w.items():
        raw = t.numpy().tobytes()
        entries.append((k, {"dtype": "F32", "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}))
        data += raw
    return entries, data


def test_repeated_name_in_the_header_is_refused(tmp_path: Path) -> None:
    entries, data = _entries(soft_weights())
    path = tmp_path / "dup.safetensors"
    # ff.bias listed twice over the same bytes: the Rust reader keeps one entry without a word
    _safetensors_by_hand(path, [*entries, entries[-1]], data)
    with pytest.raises(WeightsError, match=r"dup.safetensors: the header names 'ff.bias' twice"):
        sdnn.load_soft_attention(path)


def test_header_promising_more_data_than_the_file_holds_is_refused(tmp_path: Path) -> None:
    entries, data = _entries(soft_weights())
    path = tmp_path / "short.safetensors"
    _safetensors_by_hand(path, entries, data[:-64])
    with pytest.raises(WeightsError, match=r"short.safetensors: tensor 'ff.bias' ends at byte \d+ of the data"):
        sdnn.load_soft_attention(path)


def test_compressed_or_legacy_torch_files_are_refused(tmp_path: Path) -> None:
    stored = tmp_path / "stored.pth"
    torch.save(soft_weights(), stored)
    packed = tmp_path / "packed.pth"
    with zipfile.ZipFile(stored) as src, zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info), compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(WeightsError, match=r"packed.pth: archive member .* is compressed"):
        sdnn.load_soft_attention(packed)
    legacy = tmp_path / "legacy.pth"
    torch.save(soft_weights(), legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(WeightsError, match=r"legacy.pth is not a zip archive as torch.save writes"):
        sdnn.load_soft_attention(legacy)
