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

import pytest

from mrcnn.config import get_config
from mrcnn.export import UntrustedPackageError, deployed, load_exported
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
        calls.append(str(path))
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
