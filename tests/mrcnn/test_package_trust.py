"""Packages are code: a ``.pt2`` that this user's ``mrcnn export`` did not build is refused before any
loader opens it, unless the caller trusts it (``trust=True``, ``--trust-package``).

The doctored package here holds a pickle that would create a marker file if unpickled; the loaders
are replaced by spies, so that no test runs it even when the gate lets it through.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import mrcnn.export.trust as trust_module
from mrcnn.config import get_config
from mrcnn.exits import UsageError
from mrcnn.export import UntrustedPackageError, deployed, load_exported, package
from mrcnn.export.core import META_FILE, ExportMeta
from mrcnn.export.trust import ENV, allow_list_path, trust


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def doctored(tmp_path, monkeypatch):
    """A package that reads as an exported one, its allow-list empty and in tmp_path."""
    monkeypatch.setenv(ENV, str(tmp_path / "trusted.txt"))
    cfg = get_config("tiny")
    meta = ExportMeta("exported", "tiny", (320, 448), 1, "float32", "tensor", "cpu", cfg.box_detections_per_img,
                      28, dataclasses.asdict(cfg))
    path = tmp_path / "doctored.exported.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"doctored/extra/{META_FILE}", meta.to_json())
        z.writestr("doctored/data.pkl", pickle.dumps(_Payload(str(tmp_path / "ran"))))
    return path


@pytest.fixture
def loader_calls(monkeypatch):
    """torch.export.load replaced: the calls it got (it raises rather than unpickle anything)."""
    calls = []

    def spy(path, **_kwargs):
        calls.append(Path(path).read_bytes())  # the bytes the loader would have run
        raise RuntimeError("loader reached")

    monkeypatch.setattr(deployed.torch.export, "load", spy)
    return calls


def test_an_unknown_package_never_reaches_a_loader(doctored, loader_calls):
    with pytest.raises(UntrustedPackageError, match=r"--trust-package"):
        load_exported(doctored)
    assert loader_calls == [] and not (doctored.parent / "ran").exists()


def test_trust_and_the_allow_list_let_it_through_until_it_changes(doctored, loader_calls):
    with pytest.raises(RuntimeError, match="loader reached"):
        load_exported(doctored, trust=True)
    trust(doctored)
    assert str(doctored.resolve()) in allow_list_path().read_text()
    with pytest.raises(RuntimeError, match="loader reached"):
        load_exported(doctored)
    with zipfile.ZipFile(doctored, "a") as z:  # changed after it was built: no longer the same package
        z.writestr("doctored/extra/more.txt", "x")
    with pytest.raises(UntrustedPackageError):
        load_exported(doctored)
    assert len(loader_calls) == 2


def test_export_time_refuses_it_with_exit_2_and_runs_nothing(doctored):
    proc = subprocess.run([sys.executable, "-m", "mrcnn_bench", "export-time", str(doctored)],
                          capture_output=True, text=True, timeout=300, env={**os.environ})
    assert proc.returncode == 2 and "--trust-package" in proc.stderr and "Traceback" not in proc.stderr
    assert not (doctored.parent / "ran").exists()


def test_a_package_renamed_over_the_checked_one_is_never_loaded(doctored, loader_calls, monkeypatch):
    """The allow-list is read after the package was hashed: a rename over it at that moment (another
    package with the same layout) must not reach the loader; the bytes checked are the bytes loaded."""
    checked = doctored.read_bytes()
    trust(doctored)
    swapped = doctored.parent / "swapped.pt2"
    with zipfile.ZipFile(swapped, "w") as z:
        z.writestr(f"doctored/extra/{META_FILE}", zipfile.ZipFile(doctored).read(f"doctored/extra/{META_FILE}"))
        z.writestr("doctored/data.pkl", b"not the package that was checked")
    read_list = trust_module._listed

    def swap_then_read():
        if swapped.exists():
            os.replace(swapped, doctored)
        return read_list()

    monkeypatch.setattr(trust_module, "_listed", swap_then_read)
    with pytest.raises(RuntimeError, match="loader reached"):
        load_exported(doctored)
    assert loader_calls == [checked] and doctored.read_bytes() != checked


def test_a_damaged_allow_list_is_named_with_its_line(doctored, loader_calls):
    allow = allow_list_path()
    allow.write_bytes(b"\xff\xfe not a digest  /x.pt2\n")
    with pytest.raises(UsageError, match=r"trusted\.txt line 1 is not"):
        load_exported(doctored)
    allow.write_bytes(b"")
    trust(doctored)
    with allow.open("ab") as f:  # a path that is not UTF-8 beside a good digest is not an error
        f.write(b"0" * 64 + b"  /tmp/\xff.pt2\n")
    with pytest.raises(RuntimeError, match="loader reached"):
        load_exported(doctored)
    assert loader_calls and not (doctored.parent / "ran").exists()


def test_an_unwritable_allow_list_is_refused_before_the_export(tmp_path, monkeypatch):
    """Every package built goes on the allow-list: a list that cannot be written fails before the export."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(ENV, str(blocker / "trusted.txt"))  # its folder is a file: no user can write there
    monkeypatch.setattr(package, "export_model", lambda *_a, **_k: pytest.fail("exported before the check"))
    with pytest.raises(UsageError, match="cannot write the package allow-list"):
        package.build_packages(None, tmp_path / "out", (320, 448))
