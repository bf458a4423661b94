"""mrcnn.files: a file is replaced whole or not at all, and no temporary file is left behind."""

from __future__ import annotations

import pytest

from mrcnn.files import atomic_open, atomic_write


def test_atomic_write_replaces_text_and_bytes_and_makes_the_folder(tmp_path):
    path = tmp_path / "new" / "run.json"
    assert atomic_write(path, "{}\n") == path
    assert path.read_text() == "{}\n"
    atomic_write(path, b"\x00\x01", durable=False)
    assert path.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.json"]


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_open(path, "wb") as f:
        f.write(b"half of the new")
        raise RuntimeError("disk full")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_only_whole_file_modes_are_accepted(tmp_path):
    with pytest.raises(ValueError, match="'a'"), atomic_open(tmp_path / "x", "a"):
        pass
    assert list(tmp_path.iterdir()) == []


def test_the_harness_loads_this_checkouts_atomic_write_beside_an_older_library(tmp_path):
    """With an mrcnn that has no mrcnn.files on the path (an old commit's), the harness still writes atomically."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['mrcnn.files'] = None\n"  # `import mrcnn.files` now raises ImportError
            "from mrcnn_bench.base.files import atomic_write\n"
            f"atomic_write({str(tmp_path / 'x.json')!r}, '{{}}')\n"
            "print(atomic_write.__module__)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "mrcnn_bench.base._this_checkouts_files"
    assert (tmp_path / "x.json").read_text() == "{}"
