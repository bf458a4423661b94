"""latency-check: which base and which cases a change gets, its exit codes, and the summary it writes.

The pairs here are synthetic (their timings drawn with a known slowdown) and go through the real
pair statistics; the live measurement itself is compare's (test_compare_checkouts.py), and the
check's error rates on this machine are measured by bench/studies/latency_check/trials.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from mrcnn_bench.base import defaults
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.gates import ab, latency_check
from mrcnn_bench.gates.pairs import Pair
from mrcnn_bench.running.cases import parse_cases
from mrcnn_bench.running.records import Record


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True)
    return done.stdout.strip()


def _commit(root: Path, name: str, text: str) -> str:
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    (root / name).write_text(text)
    _git(root, "add", ".")
    _git(root, "commit", "-qm", f"{name}: {text}")
    return _git(root, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q", "-b", "main")
    return root


def test_on_the_main_line_the_base_is_heads_parent(repo):
    first = _commit(repo, "mrcnn/model.py", "1")
    _commit(repo, "mrcnn/model.py", "2")
    base = latency_check.base_commit(repo)
    assert base.commit == first and "parent" in base.why


def test_on_a_branch_the_base_is_where_it_leaves_main(repo):
    _commit(repo, "a.txt", "1")
    fork = _commit(repo, "a.txt", "2")
    _git(repo, "checkout", "-qb", "feature")
    _commit(repo, "mrcnn/rpn.py", "x")
    _commit(repo, "mrcnn/rpn.py", "y")
    _git(repo, "checkout", "-q", "main")
    _commit(repo, "a.txt", "3")  # main moves on: the base stays where the branch left it
    _git(repo, "checkout", "-q", "feature")
    base = latency_check.base_commit(repo)
    assert base.commit == fork and "leaves main" in base.why


def test_a_commit_without_a_parent_has_no_base(repo):
    _commit(repo, "a.txt", "1")
    with pytest.raises(UsageError, match="no parent"):
        latency_check.base_commit(repo)


def test_the_diff_counts_staged_unstaged_untracked_and_both_sides_of_a_rename(repo):
    _commit(repo, "mrcnn/kept.py", "x")
    base = _commit(repo, "mrcnn/old.py", "x")
    (repo / "mrcnn" / "kept.py").write_text("unstaged")
    (repo / "tools").mkdir()
    _git(repo, "mv", "mrcnn/old.py", "tools/new.py")
    (repo / "mrcnn" / "fresh.py").write_text("untracked")
    (repo / ".gitignore").write_text("out/\n")
    (repo / "out").mkdir()
    (repo / "out" / "ignored.json").write_text("{}")
    files = latency_check.changed_files(base, repo)
    assert files == [".gitignore", "mrcnn/fresh.py", "mrcnn/kept.py", "mrcnn/old.py", "tools/new.py"]


def test_only_files_under_mrcnn_select_cases():
    assert latency_check.cases_for(["docs/harness.md", "bench/mrcnn_bench/gates/ab.py", "pyproject.toml"]).cases == {}
    selection = latency_check.cases_for(["mrcnn/rpn.py", "mrcnn/losses.py", "README.md"])
    assert selection.cases == {"static/eager": ["mrcnn/rpn.py", "mrcnn/losses.py"], "static/train": ["mrcnn/losses.py"]}


def _pairs(slowdown: float, k: int = 10, rounds: int = 24, status_b: str = "ok", seed: int = 0) -> list[Pair]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(k):
        level = np.exp(rng.normal(0, 0.01, 2))
        a = list(0.1 * level[0] * np.exp(rng.normal(0, 0.05, rounds)))
        b = list(0.1 * (1 + slowdown) * level[1] * np.exp(rng.normal(0, 0.05, rounds)))
        ra = Record(row="A:static/eager", case="static/eager", variant="A", status="ok", times_s=a,
                    median_s=float(np.median(a)))
        rb = Record(row="B:static/eager", case="static/eager", variant="B", status=status_b, times_s=b,
                    median_s=float(np.median(b)))
        out.append(Pair([ra], [rb], i % 2 == 0, SimpleNamespace(records=[ra, rb]), 1.0))  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize(("slowdown", "status_b", "code", "word"), [
    (0.0, "ok", 0, "not slower"), (0.10, "ok", 1, "SLOWER"), (0.0, "error", 2, "could not measure")])
def test_the_exit_code_and_summary_follow_the_pair_verdict(monkeypatch, tmp_path, capsys, slowdown, status_b, code,
                                                          word):
    seen = {}

    def fake_run_live(opts):
        seen["opts"] = opts
        return _pairs(slowdown, status_b=status_b)

    monkeypatch.setattr(ab, "run_live", fake_run_live)
    opts = latency_check.CheckOptions(against="HEAD", cases=parse_cases("static/eager"), out=str(tmp_path / "o"),
                                      progress=False)
    assert latency_check.check(opts) == code
    assert seen["opts"].pairs == defaults.CHECK_PAIRS and seen["opts"].run.rounds == defaults.CHECK_ROUNDS
    text = capsys.readouterr().out
    assert text.startswith(f"## Latency check: {word}") and "| static/eager |" in text
    assert "10 pairs of fresh processes x 24 interleaved rounds" in text and "10% with 1.00" in text
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["check.json", "summary.md"]
    assert (tmp_path / "o" / "summary.md").read_text() == text
    doc = json.loads((tmp_path / "o" / "check.json").read_text())
    assert doc["exit"] == code and len(doc["timings"]) == 10 and doc["cases"] == ["static/eager"]


def test_a_diff_outside_mrcnn_measures_nothing_and_says_why(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(latency_check, "changed_files", lambda base: ["docs/harness.md", "bench/x.py"])
    monkeypatch.setattr(ab, "run_live", lambda opts: pytest.fail("nothing should be measured"))
    assert latency_check.check(latency_check.CheckOptions(against="HEAD", out=str(tmp_path))) == 0
    text = capsys.readouterr().out
    assert text.startswith("## Latency check: nothing to measure") and "no file under `mrcnn/`" in text


def test_a_diff_inside_mrcnn_measures_the_cases_it_selects(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(latency_check, "changed_files", lambda base: ["mrcnn/losses.py"])
    seen = {}

    def fake_run_live(opts):
        seen["cases"] = [c.name for c in opts.cases]
        return _pairs(0.0)

    monkeypatch.setattr(ab, "run_live", fake_run_live)
    # static/train is named, not measured: its pairs take longer than CI's five minutes.
    assert latency_check.check(latency_check.CheckOptions(against="HEAD", out=str(tmp_path))) == 0
    assert seen["cases"] == ["static/eager"]
    assert "static/train, for `mrcnn/losses.py` (not measured" in capsys.readouterr().out


def test_a_named_case_that_did_not_run_on_both_sides_is_undecided(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(ab, "run_live", lambda opts: _pairs(0.0))  # static/eager's pairs only
    opts = latency_check.CheckOptions(against="HEAD", cases=parse_cases("static/eager,static/train"), out=str(tmp_path))
    assert latency_check.check(opts) == 2
    monkeypatch.setattr(ab, "run_live", lambda opts: [])
    monkeypatch.setattr(ab, "live_table", lambda pairs, threshold, alpha: pd.DataFrame())
    assert latency_check.check(opts) == 2
    assert "No case ran on both sides" in capsys.readouterr().out


def test_the_power_the_summary_states_is_alpha_at_the_threshold_and_grows_with_the_slowdown():
    from mrcnn_bench.gates.stats import pair_power

    at = [pair_power(0.0139, 0.1179, 10, 24, s, threshold=0.01, alpha=0.01) for s in (0.01, 0.03, 0.05, 0.10)]
    assert at[0] == pytest.approx(0.01, abs=1e-9)
    assert at == sorted(at) and at[-1] > 0.99
    assert pair_power(0.0139, 0.1179, 18, 32, 0.05) > pair_power(0.0139, 0.1179, 10, 24, 0.05)


def test_trials_size_the_injection_from_the_excess_the_check_measured():
    """The study injects what the check sees as 10%: from checks at one fraction, in proportion
    (0.1 read as 15% gives 0.067); from checks at several, on the line through them (an intercept:
    small strips cost more than their share); a calibration that saw no slowdown is refused."""
    from studies.slowdown_calibration import calibrated_fraction

    assert calibrated_fraction([(0.1, 1.15)] * 3, 0.1) == pytest.approx(0.1 * 0.1 / 0.15, abs=5e-4)
    assert calibrated_fraction([(0.1, 1.11), (0.1, 1.29)], 0.1) == pytest.approx(0.05)  # mean excess 0.2
    line = [(0.05, 1.08), (0.05, 1.08), (0.1, 1.13)]  # excess = 0.03 + 1.0 x fraction
    assert calibrated_fraction(line, 0.1) == pytest.approx(0.07)
    with pytest.raises(ValueError, match="no slowdown"):
        calibrated_fraction([(0.1, 0.99), (0.1, 1.0)], 0.1)
    with pytest.raises(ValueError, match="no fraction"):
        calibrated_fraction([(0.05, 1.12), (0.1, 1.13)], 0.1)  # 10% lies below the line's intercept


def test_the_compare_teeth_inject_what_the_compare_measures_and_keep_their_calibration(tmp_path, monkeypatch):
    """compare_pairs/teeth.py: slowed kinds refuse to run before a calibration, or on one made with
    another hook; calibrating at one fraction (ignoring another hook's checks) gives each kind its
    share of the measured excess; once slowed trials exist the calibration they ran with cannot change."""
    from studies.compare_pairs import teeth

    from mrcnn_bench.running.slowdown import INJECTION

    calls = []

    def fake_trial(kind, case, fraction=0.0):
        calls.append((kind, fraction))
        return {"kind": kind, "case": case, "injected": fraction, "injection": INJECTION, "flagged": fraction > 0,
                "seconds": 1.0, "ratio": 1.0 + 2.0 * fraction, "ci95": "-", "process_sd": 0.0, "round_sd": 0.1}

    monkeypatch.setattr(teeth, "one_trial", fake_trial)
    case = "static/eager"
    with pytest.raises(SystemExit, match="run `calibrate` first"):
        teeth.run(tmp_path, "slow03", 1, case)
    # A calibration and checks made with the hook before this one (no "injection" field) are not reused.
    calibration = teeth.calibration_file(tmp_path)
    calibration.parent.mkdir(parents=True)
    calibration.write_text(json.dumps({case: {"checks": [], "fractions": {"slow03": 0.2}}}))
    with pytest.raises(SystemExit, match="'resnet-body' injection"):
        teeth.run(tmp_path, "slow03", 1, case)
    old = {"case": case, "injected": 0.03, "ratio": 1.09}
    calibration.with_suffix(".jsonl").write_text(json.dumps(old) + "\n")
    teeth.calibrate(tmp_path, case, 0.03, 2)  # read as 6%: each kind injects half its target
    assert calls == [("calibration", 0.03)] * 2
    stored = json.loads(calibration.read_text())[case]
    assert stored["fractions"] == {"slow02": 0.01, "slow03": 0.015, "slow05": 0.025}
    assert stored["injection"] == INJECTION and len(stored["checks"]) == 2
    teeth.run(tmp_path, "slow03", 2, case)
    assert calls[2:] == [("slow03", 0.015)] * 2
    with pytest.raises(SystemExit, match="stays as it is"):
        teeth.calibrate(tmp_path, case, 0.05, 2)
