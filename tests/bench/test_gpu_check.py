"""``mrcnn-bench gpu-check``: no CUDA device means exit 2 and nothing run; on a GPU, each step's verdict
comes from its exit codes and its records (a skipped test is "not checked", a step past its limit is
killed with its children and fails, a step the budget cannot fit is "not run").

The steps themselves need a GPU; here they are replaced by small Python commands.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mrcnn_bench.running import gpu_check
from mrcnn_bench.running.gpu_check import GpuCheckOptions, Step


def test_without_a_cuda_device_it_says_so_and_exits_2(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the no-device path cannot be seen here")
    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, "-m", "mrcnn_bench", "gpu-check", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device" in proc.stderr and "nothing was checked" in proc.stderr
    assert not out.exists()


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _junit(skipped: int) -> str:
    cases = "".join(f'<testcase name="t{i}"><skipped message="no pycocotools"/></testcase>' for i in range(skipped))
    return f'<testsuites><testsuite><testcase name="ok"/>{cases}</testsuite></testsuites>'


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine that reports a GPU, so the steps (replaced by each test) run."""
    monkeypatch.setattr(gpu_check.backends, "unavailable", lambda _backend: None)
    monkeypatch.setattr(gpu_check, "machine", lambda: {k: "x" for k in (
        "gpu", "torch", "cuda", "torchvision", "driver", "python", "cpu_cores", "commit", "date")})


def _check(monkeypatch, tmp_path, steps, budget_s=60.0):
    monkeypatch.setattr(gpu_check, "STEPS", steps)
    code = gpu_check.gpu_check(GpuCheckOptions(out=tmp_path, budget_s=budget_s), log=lambda _msg: None)
    record = json.loads((tmp_path / "gpu_check.json").read_text())
    return code, {s["name"]: s for s in record["steps"]}


def test_verdicts_follow_exit_codes_and_records(fake_gpu, monkeypatch, tmp_path):
    def write_junit(skipped):
        code = f"import pathlib, sys; pathlib.Path(sys.argv[1]).write_text({_junit(skipped)!r})"
        return lambda folder, _opts: [[*_py(code), str(folder / "tests.xml")]]

    steps = (
        Step("clean", 30, write_junit(0), gpu_check._verify_tests),
        Step("skips", 30, write_junit(2), gpu_check._verify_tests),
        Step("second-fails", 30, lambda _f, _o: [_py("print('first')"), _py("raise SystemExit(3)"), _py("")]),
        Step("first-fails", 30, lambda _f, _o: [_py("raise SystemExit(4)"), _py("")]),
    )
    code, steps = _check(monkeypatch, tmp_path, steps)
    assert code == 1
    assert steps["clean"]["verdict"] == "passed"
    assert steps["skips"]["verdict"] == "not checked" and "2 skipped" in steps["skips"]["why"]
    assert "no pycocotools" in steps["skips"]["why"]
    failed = steps["second-fails"]
    # The first command builds what the others use; after it, each runs whatever the others did.
    assert failed["verdict"] == "failed" and failed["exit_codes"] == [0, 3, 0]
    assert steps["first-fails"]["exit_codes"] == [4] and "exited 4" in steps["first-fails"]["why"]
    assert "first" in (tmp_path / "second-fails.log").read_text()
    assert "| skips | not checked |" in (tmp_path / "gpu_check.md").read_text()


def test_skips_alone_mean_could_not_decide(fake_gpu, monkeypatch, tmp_path):
    write = f"import pathlib, sys; pathlib.Path(sys.argv[1]).write_text({_junit(1)!r})"
    steps = (Step("skips", 30, lambda folder, _o: [[*_py(write), str(folder / "tests.xml")]], gpu_check._verify_tests),)
    assert _check(monkeypatch, tmp_path, steps)[0] == 2


def test_a_step_past_its_limit_is_killed_with_its_children(fake_gpu, monkeypatch, tmp_path):
    pid_file = tmp_path / "child.pid"
    spawn = ("import subprocess, sys, time; "
             f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
             f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    code, steps = _check(monkeypatch, tmp_path, (Step("hangs", 3, lambda _f, _o: [_py(spawn)]),))
    assert code == 1
    assert steps["hangs"]["verdict"] == "failed" and steps["hangs"]["exit_codes"] == [None]
    assert "killed at its limit" in steps["hangs"]["why"]
    child = int(pid_file.read_text())
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(child)], capture_output=True, text=True).stdout.strip()
    assert state in ("", "Z"), f"the step's child {child} outlived it ({state})"


def test_a_step_the_budget_cannot_fit_is_not_run(fake_gpu, monkeypatch, tmp_path):
    steps = (Step("first", 30, lambda _f, _o: [_py("")]), Step("second", 30, lambda _f, _o: [_py("")]))
    code, steps = _check(monkeypatch, tmp_path, steps, budget_s=gpu_check.MIN_STEP_S - 1)
    assert code == 2
    assert {s["verdict"] for s in steps.values()} == {"not run"}


def test_the_real_steps_name_files_that_exist(tmp_path):
    """The CUDA tests it runs are in the tree, and every step builds its commands without a GPU."""
    for spec in gpu_check.CUDA_TESTS:
        assert (gpu_check.REPO / spec.split("::")[0]).is_file(), spec
    for step in gpu_check.STEPS:
        assert step.commands(tmp_path, GpuCheckOptions()), step.name
