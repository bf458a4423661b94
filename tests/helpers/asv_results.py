"""asv result files (api version 2) written by hand, for tests that read a machine's history."""

from __future__ import annotations

import json
from pathlib import Path


def write_stage_result(folder: Path, commit: str, k: int, benchmark: str, backbone: float, mask_head: float) -> None:
    """``folder/<commit>-env-x.json`` holding ``benchmarks.<benchmark>`` of static/eager for two stages
    (backbone, mask_head), dated ``k`` seconds after a fixed start; ``machine.json`` beside it."""
    result = [[backbone, mask_head], [["'static/eager'"], ["'backbone'", "'mask_head'"]], "v", 1_000_000 + k, 1.0]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "machine.json").write_text(json.dumps({"machine": folder.name, "version": 1}))
    (folder / f"{commit[:8]}-env-x.json").write_text(json.dumps({
        "commit_hash": commit, "env_name": "env-x", "date": 1_000_000 + k, "params": {"machine": folder.name},
        "python": "3.11", "requirements": {}, "env_vars": {},
        "result_columns": ["result", "params", "version", "started_at", "duration"],
        "results": {f"benchmarks.{benchmark}": result}, "durations": {}, "version": 2,
    }))  # fmt: skip
