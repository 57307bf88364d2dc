"""The write and cache primitives every output goes through (softdeploy.files, softdeploy.cache): a failed or
interrupted write leaves the previous file, links are never written through, and a cache entry is used only while its
bytes match its digest."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

from softdeploy import cache
from softdeploy.errors import CacheError, OutputError, OverwriteError, SoftdeployWarning
from softdeploy.files import (
    atomic_output,
    check_outputs,
    final_name,
    make_folder,
    output_error,
    remove_stale_partials,
    write_bytes,
    write_text,
    write_with,
)


def _partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name)


def test_atomic_output_replaces_only_when_complete(tmp_path: Path) -> None:
    out = tmp_path / "model.onnx"
    write_text(out, "old")

    class Boom(Exception):
        pass

    with pytest.raises(Boom), atomic_output(out) as tmp:
        tmp.write_text("half of the new")
        raise Boom
    assert out.read_text() == "old"
    assert _partials(tmp_path) == []
    write_text(out, "new")
    assert out.read_text() == "new"


def test_keyboard_interrupt_leaves_previous_file(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    write_text(out, "old")
    with pytest.raises(KeyboardInterrupt), atomic_output(out) as tmp:
        tmp.write_text("partial")
        raise KeyboardInterrupt
    assert out.read_text() == "old"
    assert _partials(tmp_path) == []


def test_file_size_limit_is_one_line_naming_the_path(tmp_path: Path) -> None:
    # RLIMIT_FSIZE in a child (Python ignores SIGXFSZ, so the write fails with EFBIG like a full disk's ENOSPC)
    out = tmp_path / "big.bin"
    write_bytes(out, b"previous")
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from softdeploy.files import write_bytes\n"
        "from softdeploy.errors import OutputError\n"
        "try:\n"
        f"    write_bytes({str(out)!r}, b'x' * 100000, 'model')\n"
        "except OutputError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_child_env())
    assert r.returncode == 3, r.stderr
    assert str(out) in r.stdout and "File too large" in r.stdout
    assert out.read_bytes() == b"previous"
    assert _partials(tmp_path) == []


def _child_env() -> dict[str, str]:
    """The environment of a child that imports this softdeploy (the source tree under test, not another install)."""
    import softdeploy

    root = str(Path(softdeploy.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(x for x in (root, os.environ.get("PYTHONPATH", "")) if x)}


def test_read_only_folder_is_one_line() -> None:
    # root writes into any folder: the child drops to an unprivileged user when it is root (so the folders above
    # must be open to it: pytest's tmp_path is not)
    top = Path(tempfile.mkdtemp(prefix="softdeploy-ro-"))
    top.chmod(0o755)
    folder = top / "ro"
    folder.mkdir()
    (folder / "x.md").write_text("previous")
    folder.chmod(0o555)
    code = (
        "import os, sys\n"
        "from softdeploy.files import write_text\n"
        "from softdeploy.errors import OutputError\n"
        "if os.geteuid() == 0:\n"
        "    os.setgid(65534); os.setuid(65534)\n"
        "try:\n"
        f"    write_text({str(folder / 'x.md')!r}, 'new', 'report')\n"
        "except OutputError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    try:
        r = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/", env=_child_env()
        )
        assert r.returncode == 3, r.stderr
        assert "report" in r.stdout and "cannot be written: Permission denied" in r.stdout
        assert (folder / "x.md").read_text() == "previous"
        assert _partials(folder) == []
    finally:
        folder.chmod(0o755)
        shutil.rmtree(top, ignore_errors=True)


def test_missing_folder_and_folder_as_output(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="does not exist"):
        write_text(tmp_path / "nowhere" / "x.md", "text")
    with pytest.raises(OutputError, match="is a folder"):
        write_text(tmp_path, "text")
    with pytest.raises(OutputError, match="is a folder"):
        check_outputs([tmp_path], overwrite=True)


@pytest.mark.parametrize(
    "message",
    [
        'Error while serializing: IoError(Os { code: 27, kind: FileTooLarge, message: "File too large" })',
        "Error while serializing: I/O error: File too large (os error 27)",  # safetensors 0.8
    ],
)
def test_a_libraries_os_error_is_one_line_naming_the_path(message: str) -> None:
    class SafetensorError(Exception):
        pass

    found = output_error("out/student.safetensors", SafetensorError(message), "student")
    assert str(found) == (
        "student out/student.safetensors: cannot be written: File too large "
        "(the file size limit (ulimit -f) is below the file's size)"
    )
    assert output_error("x", SafetensorError("shape mismatch"), "student") is None


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OutputError, match=r"^results folder .*a-file/sub: cannot be written: Not a directory"):
        make_folder(tmp_path / "a-file" / "sub", "results folder")
    assert make_folder(tmp_path / "new" / "sub") == tmp_path / "new" / "sub" and (tmp_path / "new" / "sub").is_dir()
    assert make_folder(tmp_path / "new" / "sub").is_dir()  # already there: nothing to do


def _dead_pid() -> int:
    """The pid of a process that has exited (a writer killed mid-way, as far as its temporary names tell)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_stale_partials_of_dead_processes_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    stale = tmp_path / f".m.onnx.partial-{_dead_pid()}-abcd"
    live = tmp_path / f".m.onnx.partial-{os.getpid()}-abcd"
    stale.write_text("x")
    live.write_text("x")
    assert remove_stale_partials(out) == [stale]
    assert live.exists()


def test_nested_temporary_names_name_the_output_and_are_cleaned_up(tmp_path: Path) -> None:
    # quantize_file hands quantize() its temporary path, which quantize() writes through atomic_output again
    out = tmp_path / "q.onnx"
    with atomic_output(out) as outer:
        assert final_name(outer) == out
        with atomic_output(outer) as inner:
            assert final_name(inner) == out
            inner.write_text("model")
        assert outer.read_text() == "model"
    assert out.read_text() == "model" and _partials(tmp_path) == []
    with pytest.raises(OutputError) as caught, atomic_output(out, "model") as outer, atomic_output(outer, "model"):
        raise OSError(28, "No space left on device")
    assert str(caught.value).startswith(f"model {out}: cannot be written: No space left")
    dead = _dead_pid()
    torn = tmp_path / f"..q.onnx.partial-{dead}-abcd1234.partial-{dead}-dcba4321"
    torn.write_text("half")  # left by a kill during the inner write
    assert remove_stale_partials(out) == [torn]


def test_hard_link_to_input_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in.onnx"
    src.write_text("model")
    link = tmp_path / "out.onnx"
    os.link(src, link)
    with pytest.raises(OverwriteError, match="is also the input"):
        check_outputs([link], overwrite=True, sources=[src])
    sym = tmp_path / "sym.onnx"
    sym.symlink_to(src)
    with pytest.raises(OverwriteError, match="is also the input"):
        check_outputs([sym], overwrite=True, sources=[src])


def test_dangling_symlink_is_refused_and_existing_link_needs_overwrite(tmp_path: Path) -> None:
    dangling = tmp_path / "out.onnx"
    dangling.symlink_to(tmp_path / "elsewhere" / "target.onnx")
    with pytest.raises(OutputError, match="does not exist; softdeploy does not write through links"):
        check_outputs([dangling], overwrite=True)
    target = tmp_path / "target.onnx"
    target.write_text("user's file")
    link = tmp_path / "link.onnx"
    link.symlink_to(target)
    with pytest.raises(OverwriteError, match="symbolic link"):
        check_outputs([link], overwrite=False)
    check_outputs([link], overwrite=True)
    write_text(link, "new")  # replaces the link itself, never its target
    assert not link.is_symlink() and link.read_text() == "new"
    assert target.read_text() == "user's file"


def test_cache_entry_round_trip_and_poisoning(tmp_path: Path) -> None:
    entry = tmp_path / "student-abc.safetensors"
    cache.store(entry, lambda p: p.write_bytes(b"weights" * 100))
    assert cache.lookup(entry) == entry
    assert json.loads(cache.digest_path(entry).read_text())["bytes"] == 700

    entry.write_bytes(b"poisons" * 100)  # same name and size, other bytes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.lookup(entry) is None
    assert len(caught) == 1 and issubclass(caught[0].category, SoftdeployWarning)
    message = str(caught[0].message)
    assert str(entry) in message and "does not match" in message and "\n" not in message
    assert not entry.exists()
    assert any(p.name.startswith("student-abc.safetensors.bad-") for p in tmp_path.iterdir())


def test_cache_entry_truncated_or_without_digest(tmp_path: Path) -> None:
    entry = tmp_path / "experts.safetensors"
    cache.store(entry, lambda p: p.write_bytes(b"w" * 1000))
    with entry.open("r+b") as f:
        f.truncate(10)
    with pytest.raises(CacheError, match="10 bytes, its digest records 1000"):
        cache.verify(entry)
    with pytest.warns(SoftdeployWarning, match="truncated"):
        assert cache.lookup(entry) is None
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes(b"no digest")  # written by hand, or killed before its digest
    with pytest.warns(SoftdeployWarning, match="no content digest"):
        assert cache.lookup(bare) is None
    assert cache.lookup(tmp_path / "absent.safetensors") is None


def test_cache_loader_failure_sets_entry_aside(tmp_path: Path) -> None:
    entry = tmp_path / "c.bin"
    cache.store(entry, lambda p: p.write_bytes(b"fine bytes"))

    def loader(p: Path) -> object:
        raise ValueError("shape mismatch")

    with pytest.warns(SoftdeployWarning, match="cannot be loaded"):
        assert cache.load_checked(entry, loader) is None
    assert not entry.exists()


def test_outputs_get_the_usual_mode_or_keep_the_replaced_files(tmp_path: Path) -> None:
    """A writer that creates its file 0600 (safetensors' does) still leaves a file others may read, as open() would;
    a file replaced in place keeps its mode."""
    out = tmp_path / "student.safetensors"

    def private(p: Path) -> None:
        p.write_bytes(b"weights")
        p.chmod(0o600)

    umask = os.umask(0o022)
    try:
        write_with(out, private)
        assert out.stat().st_mode & 0o777 == 0o644
        out.chmod(0o640)
        write_with(out, private)
        assert out.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(umask)


def test_stale_partial_folders_of_dead_processes_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "student"
    stale = tmp_path / f".student.partial-{_dead_pid()}"
    (stale / "1_Pooling").mkdir(parents=True)
    (stale / "config.json").write_text("{")
    live = tmp_path / f".student.partial-{os.getpid()}"
    live.mkdir()
    assert remove_stale_partials(out) == [stale]
    assert not stale.exists() and live.is_dir()


class _FolderWriter:
    """Writes one file into the folder it is given, as save_pretrained does (the student folder's writer only needs
    that)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def save_pretrained(self, path: str, **_: object) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / self.name).write_text("{}")


def test_the_student_folder_writer_cleans_up_after_a_killed_writer(tmp_path: Path) -> None:
    """A writer killed mid-way leaves its temporary folder (removed by the next write) and, killed between its two
    renames, the previous folder moved aside (put back under its name when no new one is there)."""
    from types import SimpleNamespace

    from softdeploy.distill.students import save_student_folder

    student = SimpleNamespace(bert=_FolderWriter("config.json"), hidden_size=8, normalize=False, pooling="mean")
    tokenizer = _FolderWriter("tokenizer.json")
    dead = _dead_pid()
    folder = tmp_path / "run" / "student"
    folder.parent.mkdir()
    (folder.parent / f".student.partial-{dead}" / "1_Pooling").mkdir(parents=True)
    aside = folder.parent / f".student.old-{dead}"
    aside.mkdir()
    (aside / "config.json").write_text('{"previous": true}')
    # the previous folder comes back under its name, so without --overwrite the new write is refused
    with pytest.raises(OverwriteError, match="pass --overwrite"):
        save_student_folder(student, tokenizer, folder, max_length=16)  # type: ignore[arg-type]
    assert (folder / "config.json").read_text() == '{"previous": true}'
    assert sorted(p.name for p in folder.parent.iterdir()) == ["student"]
    # with a new folder in place, a stale aside copy is removed
    aside.mkdir()
    save_student_folder(student, tokenizer, folder, max_length=16, overwrite=True)  # type: ignore[arg-type]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["student"]
    assert (folder / "config.json").read_text() == "{}" and (folder / "modules.json").is_file()
