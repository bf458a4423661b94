"""The gate's exact compile check: failure messages that name the metric, the change and its cause
(from XLA's compilation analysis), and the real gate on static/xla failing on an injected recompile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mrcnn_bench.gates import gate

REPO = Path(__file__).resolve().parents[2]


SAMPLE_XLA_LOG = textwrap.dedent("""\
    mrcnn-bench gate: call 2 on image (250, 300) -> model input [1, 3, 320, 384]
    Compilation Analysis: ================================================================================
    Compilation Analysis: Compilation Cause
    Compilation Analysis:   user torch_xla.sync
    Compilation Analysis: Graph Info:
    Compilation Analysis:   Graph Hash: abc123
    Compilation Analysis:   Number of Graph Inputs: 1
    Compilation Analysis: Python Frame Triggered Execution:
    Compilation Analysis:   sync (/site-packages/torch_xla/torch_xla.py:87)
    Compilation Analysis:   run (/repo/bench/mrcnn_bench/running/runner.py:277)
    Compilation Analysis: --------------------------------------------------------------------------------
    """)


def test_gate_failure_messages_name_metric_change_and_cause():
    causes = gate.xla_compile_causes(SAMPLE_XLA_LOG)
    assert causes == [{"cause": ["user torch_xla.sync"], "graph_hash": "abc123",
                       "frames": ["sync (/site-packages/torch_xla/torch_xla.py:87)",
                                  "run (/repo/bench/mrcnn_bench/running/runner.py:277)"],
                       "during": "call 2 on image (250, 300) -> model input [1, 3, 320, 384]"}]
    base = {"uncached_compile": 2, "flops": 10.0, "per_call": [{"image": [240, 320], "uncached_compile": 1},
                                                                {"image": [250, 300], "uncached_compile": 1}],
            "xla_causes": []}
    now = {"uncached_compile": 3, "flops": 10.0, "xla_causes": causes,
           "per_call": [{"image": [240, 320], "uncached_compile": 1}, {"image": [250, 300], "uncached_compile": 2}]}
    (msg,) = gate.compile_failures("static/xla", base, now)
    assert msg.startswith("static/xla: uncached_compile rose from 2 to 3 (+1)")
    assert "after the call on image [250, 300]" in msg and "model input [1, 3, 320, 384]" in msg
    assert "runner.py:277" in msg
    assert gate.compile_failures("static/xla", base, base) == []
    dyn = gate.compile_failures("static/inductor", {"graph_breaks": 0}, {
        "graph_breaks": 1, "reasons": {"graph_breaks": ["data-dependent branch (model.py:40)"], "recompiles": []}})
    assert dyn == ["static/inductor: graph_breaks rose from 0 to 1 (+1)\n    graph break: data-dependent branch "
                   "(model.py:40)"]


@pytest.mark.slow
@pytest.mark.xla
def test_gate_fails_on_an_injected_recompile(tmp_path):
    """The real gate on static/xla, against the committed baseline, failing when images are padded tightly.

    That the counts are flat over the seven sizes without the fault is what CI's own ``make gate``
    checks against the same baseline (and ``test_xla`` per bucket), so it is not measured again here.
    """
    pytest.importorskip("torch_xla")
    baseline = json.loads((REPO / "baselines" / "gate_tiny.json").read_text())["cases"]["static/xla"]
    assert baseline["uncached_compile"] == 2 and baseline["fallback_ops"] == 0  # one per canvas bucket
    env = {**os.environ, "PJRT_DEVICE": "CPU"}
    fault = subprocess.run([sys.executable, "-m", "mrcnn_bench", "gate", "--cases", "static/xla", "--accuracy", "none",
                            "--inject", "recompile"], env=env, cwd=REPO, capture_output=True, text=True)
    assert fault.returncode == 1, fault.stdout + fault.stderr
    assert "GATE FAILED" in fault.stdout and "static/xla: uncached_compile rose from 2 to" in fault.stdout
    assert "XLA compiled a new graph" in fault.stdout and "model input [1, 3, 320, 384]" in fault.stdout
