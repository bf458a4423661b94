"""The accuracy studies' pool of training runs: at most N at a time, each logged, stopping at a rejected one."""

from __future__ import annotations

import sys

from studies import training_runs
from studies.training_runs import Job, run_jobs


def _job(tmp_path, label: str, code: int) -> Job:
    script = f"import sys; print('run {label}'); sys.exit({code})"
    return Job(label, (sys.executable, "-c", script), tmp_path / f"{label}.log")


def test_every_job_runs_and_logs_and_each_end_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(training_runs, "POLL_S", 0.01)
    seen: list[tuple[str, int]] = []
    jobs = [_job(tmp_path, name, 0) for name in ("a", "b", "c")]
    assert run_jobs(jobs, 2, lambda job, code: seen.append((job.label, code)) is None) == 0
    assert sorted(seen) == [("a", 0), ("b", 0), ("c", 0)]
    assert all((tmp_path / f"{n}.log").read_text() == f"run {n}\n" for n in "abc")


def test_a_rejected_end_stops_new_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(training_runs, "POLL_S", 0.01)
    jobs = [_job(tmp_path, "bad", 3), _job(tmp_path, "never", 0)]
    ends: list[int] = []
    assert run_jobs(jobs, 1, lambda job, code: ends.append(code) or code == 0) == 1
    assert ends == [3] and not (tmp_path / "never.log").exists()
