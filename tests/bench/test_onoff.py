"""``studies.onoff``: interleaved on/off rounds, appended call by call, resumed by key."""

from __future__ import annotations

from pathlib import Path

from studies.onoff import done_keys, paired, read_lines, run_rounds, seconds_by_round


def test_rounds_alternate_order_and_resume(tmp_path: Path):
    out = tmp_path / "lever.jsonl"
    calls: list[str] = []
    variants = {"off": lambda: calls.append("off"), "on": lambda: calls.append("on")}
    assert run_rounds(variants, 3, out, extra=lambda: {"load": 1.0}) == 6
    assert calls == ["off", "on", "on", "off", "off", "on"]  # A B, B A, A B
    rows = read_lines(out)
    assert [r["key"] for r in rows[:2]] == ["0:off", "0:on"] and all(r["load"] == 1.0 for r in rows)
    # A rerun with more rounds times only the new ones; a prefix keeps another workload's keys apart.
    calls.clear()
    assert run_rounds(variants, 4, out) == 2 and calls == ["on", "off"]
    assert run_rounds(variants, 4, out) == 0
    assert run_rounds(variants, 1, out, prefix="coco:") == 2
    assert {"3:on", "coco:0:off"} <= done_keys(out)


def test_paired_ratio_uses_rounds_both_variants_ran():
    rows = [dict(round=r, variant=v, seconds=s) for r, v, s in [
        (0, "off", 1.0), (0, "on", 0.5), (1, "off", 2.0), (1, "on", 1.0), (2, "off", 4.0), (3, "on", 9.0)]]
    assert seconds_by_round(rows, "on") == {0: 0.5, 1: 1.0, 3: 9.0}
    pair = paired(rows, "off", "on")
    assert pair["rounds"] == 2 and pair["median_ratio"] == 0.5  # rounds 2 and 3 have one side only
    assert pair["ci95"][0] <= 0.5 <= pair["ci95"][1]
    assert paired(rows, "off", "missing") == {"median_ratio": None, "ci95": None, "rounds": 0}
