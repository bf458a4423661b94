"""``asv report --confirm``: each timed block's compare is run and its verdict written into the block;
exact figures are not re-run; a compare that cannot decide says so."""

from __future__ import annotations

from pathlib import Path

from mrcnn_bench.changes import confirm_command, live_confirm
from mrcnn_bench.changes import regression_report as report
from mrcnn_bench.changes.changepoints import ChangePoint


def _row(ratio: float, p: float | None) -> dict:
    return {"case": "static/eager", "ratio_b_over_a": ratio, "ci95": "1.021-1.041", "p_value": p, "pairs": 12,
            "n": 32, "regression": p is not None and p < 0.01}


def confirm(metric: str, parent: str, commit: str, pairs: int | None) -> tuple[str, int | None]:
    """A block's (confirm command, pairs) as the report writes them (the A/A noise chosen to give ``pairs``)."""
    command, _, _ = confirm_command.confirm(metric, parent, commit, 4.0, {})
    return (command.replace(f"--pairs {confirm_command.GUESS_PAIRS}", f"--pairs {pairs}"), pairs)


def test_each_timed_block_is_confirmed_and_exact_ones_are_not_rerun():
    calls = []
    outcomes = iter([live_confirm.Outcome(1, {"comparison": [_row(1.031, 1e-5)]}, "", 300.0),
                     live_confirm.Outcome(0, {"comparison": [_row(1.002, 0.61)]}, "", 330.0),
                     live_confirm.Outcome(2, None, "mrcnn-bench compare: error: unknown revision", 4.0)])

    def fake(args: list[str], repo: Path) -> live_confirm.Outcome:
        calls.append((args, repo))
        return next(outcomes)

    blocks = [(confirm("Latency.track_ratio(static/eager)", "aaaa1111", "bbbb2222", 12)),
              (confirm("Compiles.track_count(static/xla, xla_compiles)", "aaaa1111", "bbbb2222", None)),
              (confirm("Training.track_ratio(static/train)", "cccc3333", "dddd4444", 9)),
              (confirm("Latency.track_ratio(static/inductor)", "eeee5555", "ffff6666", 20))]
    got = live_confirm.confirm_each(blocks, Path("/repo"), run=fake, log=lambda _line: None)
    assert [a[:4] for a, _ in calls] == [["compare", "aaaa1111", "bbbb2222", "--cases"],
                                         ["compare", "cccc3333", "dddd4444", "--cases"],
                                         ["compare", "eeee5555", "ffff6666", "--cases"]]
    assert calls[0][0][4:8] == ["static/eager", "--threshold", "0", "--pairs"] and calls[0][0][8] == "12"
    assert got[0].startswith("confirmed slower: B/A 1.0310 (95% CI 1.021-1.041, p 1e-05), 12 pairs x 32 rounds")
    assert got[1] == "", "compile counts are exact in the history: not re-run"
    assert got[2].startswith("not confirmed") and "5.5 min" in got[2]
    assert got[3].startswith("could not decide (exit 2") and "unknown revision" in got[3]


def test_the_verdict_is_written_into_the_block():
    level = report.Level(1.0, 0.9, 1.1, 3)
    step = ChangePoint("Latency.track_ratio(static/eager)", "bbbb2222", 5, 1.0, 1.04, 4.0, 1e-4, "regression")
    entry = report.Regression("main", "m", step, "bbbb2222" * 5, "aaaa1111" * 5, "s", level, level,
                              verdict="confirmed slower: B/A 1.0310")
    assert r"- Confirmed live: confirmed slower: B/A 1\.0310" in report.markdown([entry])
    assert "<b>Confirmed live:</b> confirmed slower" in report.page([report.Section("main", "m", [step], [entry])])
    assert live_confirm.verdict(live_confirm.Outcome(1, {"comparison": [_row(1.03, None)]}, "", 60.0)).startswith(
        "confirmed slower: B/A 1.0300 (95% CI 1.021-1.041, p -)")
