"""The asv suite against the oldest commit of main's tracked history.

asv runs today's suite (bench/) against the library of every commit it measures. A module-level
import of a library name younger than the oldest commit makes ``setup_cache`` fail there, and asv
then skips every benchmark of every older commit, so the history silently stops at that name; a
config field read without a default fails every benchmark of the older commits the same way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _history_start() -> str:
    """HISTORY_FROM of the Makefile: the first commit `make asv-history` measures."""
    match = re.search(r"^HISTORY_FROM := (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert match, "the Makefile names no HISTORY_FROM"
    return match.group(1)


# Imports the suite, then what each commit's first process runs before its rounds on every tracked
# inference case (the FLOP probe, through the staging rule): the old library's config may lack
# fields the harness reads. Prints the library's path last.
PROBE_TRACKED_CASES = """
import sys

# As in asv's environment, where the commit's wheel is installed: no module of today's library may
# stand in for one the old library lacks (an editable install's finder maps each module by name).
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
import benchmarks, mrcnn
from mrcnn.weights import synthetic_weights, textured_images
from mrcnn_bench.running.cases import CASES, TRACKED, Row, Workload
from mrcnn_bench.running.context import Context
from mrcnn_bench.running.probes import case_flops

ctx = Context("tiny", {}, Workload(), synthetic_weights("tiny"), textured_images(((240, 320),)), [], 1, 0)
for name in TRACKED:
    if CASES[name].phase == "inference":
        assert case_flops(Row(CASES[name]), ctx) > 0, name
print(mrcnn.__file__)
"""


def test_asv_suite_imports_and_probes_against_the_oldest_history_commit(tmp_path):
    commit = _history_start()
    archive = tmp_path / "mrcnn.tar"
    made = subprocess.run(
        ["git", "-C", str(REPO), "archive", "-o", str(archive), commit, "mrcnn"], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone (a shallow clone?): {made.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "old", filter="data")
    path = os.pathsep.join(str(p) for p in (tmp_path / "old", REPO / "bench", REPO / "bench" / "asv_suite"))
    done = subprocess.run(
        [sys.executable, "-c", PROBE_TRACKED_CASES],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert str(tmp_path / "old") in done.stdout  # the old library was the one imported
