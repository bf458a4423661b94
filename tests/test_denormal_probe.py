"""The subnormal-float probe's counter: nonzero float32 values below the smallest normal one."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "denormal_probe.py"
_spec = importlib.util.spec_from_file_location("denormal_probe", SCRIPT)
probe = importlib.util.module_from_spec(_spec)  # a script in bench/, not a package
sys.modules["denormal_probe"] = probe
_spec.loader.exec_module(probe)


def test_subnormals_counts_only_nonzero_values_below_the_smallest_normal():
    tiny = torch.finfo(torch.float32).tiny
    t = torch.tensor([0.0, tiny, tiny / 2, -tiny / 4, 1e-45, 1.0, -0.0])
    assert probe.subnormals([t]) == 3  # tiny/2, -tiny/4 and 1e-45 (the smallest subnormal)
    assert probe.subnormals([t.to(torch.bfloat16), t]) == 3  # only float32 tensors are counted
