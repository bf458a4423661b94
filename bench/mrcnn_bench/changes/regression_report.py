"""The regression report: each regression change point of the history, written to be filed as is.

    mrcnn-bench asv report [--results results/asv] [--repo .] [--noise [MACHINE=]DIR ...]
        [--line NAME=REVS ...] [--md FILE.md] [--html FILE.html] [--dashboard URL] [--confirm]

For every line of commits (default: main, and the scratch and steps ranges of
:mod:`mrcnn_bench.history.scratch_range`) and every asv machine with results on it, finds the change points
of the held figures (:data:`mrcnn_bench.changes.history_series.HELD`) and of the stage ratios
(:data:`~mrcnn_bench.changes.history_series.STAGES`) with :mod:`mrcnn_bench.changes.changepoints`. Each regression
in a held figure becomes a block: the commit and its subject, the metric, the level before and after
with 95% intervals (Student's t over the commits of each level), the stages whose ratio stepped
within one commit of it in the same direction, the work counters of its case that changed near it
(exact: :mod:`mrcnn_bench.changes.work_steps`, which also lists every rise in work on the line, a
regression of its own), the graph's address on the dashboard, and a command
that confirms it live (the commit against its parent, interleaved:
:mod:`mrcnn_bench.changes.confirm_command`; against the last commit with a value where the machine has none
for commits that change the library, not measured or failed, which the block counts). A step in a
``torchvision/`` case, the control, is marked so. ``--md`` writes the blocks as markdown;
``--html`` writes a page of the dashboard with the same blocks and, beside each line's change
points, the steps asv's own detection flagged (read from the published ``regressions.json`` when it
is there). ``--confirm`` runs each timed block's confirm command and writes its verdict into the
block (:mod:`mrcnn_bench.changes.live_confirm`). Every text that comes from git or from a file is escaped.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mrcnn_bench.base import vcs
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.changes import (
    asv_files,
    asv_regressions,
    asv_results_table,
    changepoints,
    history_series,
    live_confirm,
    work_steps,
)
from mrcnn_bench.changes.changepoints import ChangePoint
from mrcnn_bench.changes.confirm_command import case_of, confirm, noise_by_machine
from mrcnn_bench.changes.levels import Level, levels
from mrcnn_bench.history.scratch_range import RANGES
from mrcnn_bench.publish.screenshots import graph_hash

STAGE_WINDOW = 1  # a stage's change point counts when it is this many commits or fewer from the step
DEFAULT_LINES = {"main": "main", **{name: rng.revs for name, rng in RANGES.items()}}


@dataclass(frozen=True)
class Regression:
    """A regression change point of a held figure, with what a maintainer needs to file it."""

    line: str
    machine: str
    point: ChangePoint
    commit: str  # full hash, or the 8 characters when git does not know it
    parent: str
    subject: str
    before: Level
    after: Level
    stages: list[ChangePoint] = field(default_factory=list)
    url: str = ""
    command: str = ""
    pairs: int | None = None  # process pairs of the confirm command
    pairs_note: str = ""
    # Commits that change the library with no value between ``parent`` (then the last with one) and this.
    unmeasured: int = 0
    work: list[ChangePoint] = field(default_factory=list)  # work counter steps of its case near it
    verdict: str = ""  # the confirm command's verdict, when it was run (--confirm: live_confirm)


def git_commit(repo: Path, commit: str) -> tuple[str, str, str]:
    """(full hash, first parent, subject) of ``commit``; ``(commit, commit + "^", "")`` when git
    does not know it."""
    done = vcs.output(repo, "log", "-1", "--format=%H%x00%P%x00%s", "--end-of-options", commit, "--")
    if done is None or "\0" not in done:
        return commit, f"{commit}^", ""
    full, parents, subject = done.split("\0", 2)
    return full, (parents.split() or [f"{commit}^"])[0], subject


def graph_url(dashboard: str, suite: dict | None, metric: str, machine: str, branch: str) -> str:
    """The address of ``metric``'s graph on the dashboard, for ``machine`` and ``branch``; "" when the
    suite's parameters are unknown."""
    name, _, params = metric.partition("(")
    key = f"benchmarks.{name}"
    if not suite or key not in suite:
        return ""
    values = [v for v in params.rstrip(")").split(", ") if v] if params else []
    chosen = {f"p-{p}": repr(v) for p, v in zip(suite[key].get("param_names", []), values, strict=False)}
    return f"{dashboard}index.html" + graph_hash({"benchmarks": suite}, key, {**chosen, "machine": machine,
                                                                           "branch": branch})


def branch_of(line: str) -> str:
    """The git branch asv draws ``line`` on: main, a range's branch, or the line's own name."""
    return RANGES[line].branch if line in RANGES else line


def regressions(
    line: str, revs: str, machine: str, results: Path, repo: Path, noise: dict[str, float],
    dashboard: str = "", suite: dict | None = None,
) -> Section:
    """The :class:`Section` of ``machine`` on ``line`` (``git rev-list REVS``), without asv's flags:
    every change point of the held figures, a :class:`Regression` for each that is one, the gaps
    (:func:`history_series.gaps`), the result files that could not be used (:mod:`asv_files`) and
    the steps of the work counters (:mod:`work_steps`)."""
    commits = asv_results_table.line_of_commits(repo, revs)
    read = asv_files.read(results, machine)  # once for the held figures, the stages and the work
    series, _, left_out = history_series.read_asv(results, machine, commits, read=read)
    points = changepoints.find(series)
    try:
        stage_series, _, _ = history_series.read_asv(results, machine, commits, history_series.STAGES, read)
    except UsageError:  # measured before stages were: none to show
        stage_series = {}
    stage_points = changepoints.find(stage_series) if stage_series else []
    work = work_steps.steps(results, machine, commits, read)
    position = {c[:8]: i for i, c in enumerate(commits)}
    branch = branch_of(line)
    # Where the machine has no value for commits that change the library before a point, the step lies
    # anywhere after the last commit with one, so that is what a live compare starts from.
    gaps = history_series.gaps(repo, series, points)
    out = []
    for p in points:
        if p.direction != "regression":
            continue
        full, parent, subject = git_commit(repo, p.commit)
        previous, unmeasured = gaps.get((p.metric, p.index), ("", 0))
        if unmeasured:
            parent = git_commit(repo, previous)[0]
        before, after = levels([q for q in points if q.metric == p.metric], series[p.metric][1], p)
        moved = moved_with(p, stage_points, position)
        command, pairs, note = confirm(p.metric, parent[:8], full[:8], p.change_pct, noise)
        out.append(Regression(line, machine, p, full, parent, subject, before, after, moved,
                              graph_url(dashboard, suite, p.metric, machine, branch), command, pairs, note,
                              unmeasured, work_steps.near(p, work, position)))
    return Section(line, machine, points, out, gaps=gaps, skipped=left_out, work=work)


def moved_with(point: ChangePoint, stage_points: Sequence[ChangePoint], position: dict[str, int]) -> list[ChangePoint]:
    """The stage change points in ``point``'s direction within :data:`STAGE_WINDOW` commits of it
    (``position``: commit -> its place on the line)."""
    at = position.get(point.commit)
    return [s for s in stage_points if at is not None and s.direction == point.direction
            and s.commit in position and abs(position[s.commit] - at) <= STAGE_WINDOW]


def markdown(entries: Sequence[Regression]) -> str:
    """The blocks of the report, one per regression (subjects escaped for markdown)."""
    if not entries:
        return "No regression change point in the held figures.\n"
    blocks = []
    for e in entries:
        p = e.point
        change = "-" if p.change_pct is None else f"{p.change_pct:+.2f}%"
        stages = ", ".join(f"{s.metric.removeprefix('Stages.track_ratio')} {s.change_pct:+.1f}% at {s.commit}"
                           for s in e.stages if s.change_pct is not None) or "none stepped (or none measured)"
        lines = [
            f"### {_md(p.metric)} {change} at {e.commit[:8]} ({e.line}, {_md(e.machine)})",
            "",
            f"- Commit: `{e.commit}`: {_md(e.subject) or '(subject unknown)'}",
            f"- Before: {e.before.text()}",
            f"- After: {e.after.text()}",
            f"- Change point: p = {p.p_value:.2g} (Apache Otava, {_settings()}); index {p.index} of the line",
            f"- Stages that stepped with it: {_md(stages)}",
        ]
        if e.url:
            lines.append(f"- Graph: <{e.url}>")
        if e.work:
            lines.append(f"- Work that changed with it ({work_steps.EXACT_NOTE}): "
                         + _md("; ".join(work_steps.describe(w) for w in e.work)))
        if e.unmeasured:
            lines.append(f"- {_md(unmeasured_text(e))}")
        if is_control(p.metric):
            lines.append(f"- {_md(CONTROL_TEXT)}")
        first = "the last commit measured before it" if e.unmeasured else "the parent"
        lines += [f"- Confirm ({first} first):", "", "  ```bash", f"  {e.command}", "  ```"]
        if e.pairs_note:
            lines.append(f"  Pairs: {e.pairs_note}.")
        if e.verdict:
            lines += ["", f"- Confirmed live: {_md(e.verdict)}"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


CONTROL_TEXT = ("Control: torchvision's own model, which no commit here changes; a step in it is the "
                "measurement's or the machine's, not the code's")


def left_out_markdown(found: Sequence[Section]) -> str:
    """A section naming each result file that could not be used, per line and machine: the report was
    made without those commits ("" when none was left out)."""
    lines = [f"- {_md(s.line)}, {_md(s.machine)}: {_md(k.text())}" for s in found for k in s.skipped]
    if not lines:
        return ""
    return "\n## Result files left out (their commits are missing from the analysis)\n\n" + "\n".join(lines) + "\n"


def is_control(metric: str) -> bool:
    """Whether ``metric`` times torchvision's model (a case named ``torchvision/...``)."""
    return case_of(metric).startswith("torchvision/")


def unmeasured_text(e: Regression) -> str:
    """What a block says when its machine has no value for some commits before the step."""
    return (f"No value on this machine (not measured, or failed) for the {e.unmeasured} commit(s) that change "
            f"the library between {e.parent[:8]} and {e.commit[:8]}; the step is somewhere in "
            f"{e.parent[:8]}..{e.commit[:8]}: "
            "confirm it over the whole range, then bisect it (asv find)")


def gap_text(previous: str, n: int, commit: str) -> str:
    """The page's note on a change point whose machine has no value for ``n`` commits since ``previous``."""
    return f"{n} since {previous[:8]}: the step lies in {previous[:8]}..{commit[:8]}"


def _md(text: str) -> str:
    """Text that markdown shows as written: its punctuation escaped, no line breaks."""
    out = " ".join(str(text).split())
    for ch in "\\`*_{}[]<>()#+-.!|":
        out = out.replace(ch, "\\" + ch)
    return out


def _settings() -> str:
    return ", ".join(f"{k} {v:g}" for k, v in changepoints.SETTINGS.items())


_STYLE = ("body{font-family:sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;margin:.5em 0}"
          "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}.regression{color:#a00}"
          ".improvement{color:#070}pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}")


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]], classes: Sequence[str] = ()) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        f"<tr class=\"{html.escape(classes[i]) if i < len(classes) else ''}\">"
        + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>"
        for i, row in enumerate(rows)
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def page(sections: Sequence[Section]) -> str:
    """The dashboard page: per line and machine, both detections and the regression blocks."""
    parts = [f"<!doctype html><html><head><meta charset=\"utf-8\"><title>Change points</title><style>{_STYLE}"
             "</style></head><body><h1>Change points of the history</h1>",
             f"<p>Apache Otava ({html.escape(_settings())}) on each held figure, lower is better; beside it, the "
             "steps asv's own detection flagged (its regressions page). <a href=\"index.html\">Dashboard</a></p>"]
    for s in sections:
        parts.append(f"<h2>{html.escape(s.line)}: {html.escape(s.machine)}</h2>")
        if s.error:
            parts.append(f"<p>{html.escape(s.error)}</p>")
            continue
        if s.skipped:
            parts.append("<p>Result files left out (their commits are missing here):</p><ul>"
                         + "".join(f"<li>{html.escape(k.text())}</li>" for k in s.skipped) + "</ul>")
        rows = [(p.metric, p.commit, p.index, f"{p.before:.4g}", f"{p.after:.4g}",
                 "-" if p.change_pct is None else f"{p.change_pct:+.2f}%", f"{p.p_value:.2g}", p.direction,
                 gap_text(*s.gaps[(p.metric, p.index)], p.commit) if (p.metric, p.index) in s.gaps else "")
                for p in s.points]
        parts.append("<h3>Change points (mrcnn-bench steps)</h3>")
        parts.append(_table(("metric", "commit", "index", "before", "after", "change", "p", "direction",
                             "after commits with no value here"), rows,
                            [p.direction for p in s.points]) if rows else "<p>None.</p>")
        parts.append(work_steps.page_part(s.work))
        parts.append("<h3>asv's flags</h3>")
        flags = [(f["benchmark"], str(f["commit"])[:8], f"{f['before']:.4g}", f"{f['after']:.4g}")
                 for f in s.flags]
        parts.append(_table(("benchmark", "commit", "before", "after"), flags) if flags else
                     "<p>None on this branch and machine (or asv publish has not run).</p>")
        for e in s.regressions:
            change = "-" if e.point.change_pct is None else f"{e.point.change_pct:+.2f}%"
            stages = "; ".join(f"{x.metric} {x.change_pct:+.1f}% at {x.commit}" for x in e.stages
                               if x.change_pct is not None) or "none stepped (or none measured)"
            link = f" <a href=\"{html.escape(e.url)}\">graph</a>" if e.url else ""
            parts.append(
                f"<h3 class=\"regression\">{html.escape(e.point.metric)} {html.escape(change)} at "
                f"{html.escape(e.commit[:8])}{link}</h3><ul>"
                f"<li>Commit <code>{html.escape(e.commit)}</code>: {html.escape(e.subject)}</li>"
                f"<li>Before: {html.escape(e.before.text())}</li><li>After: {html.escape(e.after.text())}</li>"
                f"<li>Stages that stepped with it: {html.escape(stages)}</li>"
                + (f"<li>Work that changed with it: {html.escape('; '.join(map(work_steps.describe, e.work)))}</li>"
                   if e.work else "")
                + (f"<li>{html.escape(unmeasured_text(e))}</li>" if e.unmeasured else "")
                + (f"<li>{html.escape(CONTROL_TEXT)}</li>" if is_control(e.point.metric) else "") + "</ul>"
                f"<pre>{html.escape(e.command)}</pre><p>{html.escape(e.pairs_note)}</p>"
                + (f"<p><b>Confirmed live:</b> {html.escape(e.verdict)}</p>" if e.verdict else "")
            )
    parts.append("</body></html>\n")
    return "\n".join(parts)


@dataclass(frozen=True)
class Section:
    """One line of commits on one machine: its change points, asv's flags and the regressions."""

    line: str
    machine: str
    points: list[ChangePoint] = field(default_factory=list)
    regressions: list[Regression] = field(default_factory=list)
    flags: list[dict] = field(default_factory=list)
    error: str = ""
    gaps: dict[tuple[str, int], tuple[str, int]] = field(default_factory=dict)  # see :func:`regressions`
    skipped: list[asv_files.Skipped] = field(default_factory=list)  # result files left out
    work: list[ChangePoint] = field(default_factory=list)  # steps of the work counters (work_steps)


def sections(lines: dict[str, str], results: Path, repo: Path, noise: dict[str | None, dict[str, float]],
             dashboard: str, html_dir: Path | None, only: str | None = None) -> list[Section]:
    """A :class:`Section` for each line and each machine (``only``, when given) with enough of its commits;
    ``noise``: :func:`noise_by_machine`."""
    suite_path = results / "benchmarks.json"
    asv_results_table.suite_versions(results)  # a broken benchmarks.json is an error here, not a silent empty report
    suite = json.loads(suite_path.read_text()) if suite_path.is_file() else None
    flagged = asv_regressions.flags(html_dir) if html_dir and (html_dir / "regressions.json").is_file() else []
    out = []
    for line, revs in lines.items():
        try:
            commits = asv_results_table.line_of_commits(repo, revs)
        except UsageError as e:  # a range not built here (make asv-scratch builds both)
            out.append(Section(line, "-", error=str(e)))
            continue
        branch = branch_of(line)
        for machine, count in history_series.machines(results, commits).items():
            if count < changepoints.MIN_POINTS or only not in (None, machine):
                continue
            try:
                section = regressions(line, revs, machine, results, repo, noise.get(machine, noise.get(None, {})),
                                      dashboard, suite)
            except UsageError as e:
                out.append(Section(line, machine, error=str(e)))
                continue
            mine = [f for f in flagged if f["machine"] == machine and f["branch"] == branch
                    and str(f["commit"])[:8] in {c[:8] for c in commits}]
            out.append(dataclasses.replace(section, flags=mine))
    return out


def build_parser(prog: str = "mrcnn-bench asv report") -> argparse.ArgumentParser:
    """``mrcnn-bench asv report``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--results", type=Path, default=Path("results/asv"),
                        help="asv's results_dir (default: %(default)s)")
    parser.add_argument("--repo", type=Path, default=Path("."), help="the git repository (default: %(default)s)")
    parser.add_argument("--noise", action="append", default=[], metavar="[MACHINE=]DIR",
                        help="an A/A study's folder (run_*.json): sizes the pairs; MACHINE= for one machine's "
                             "blocks (repeatable)")
    parser.add_argument("--line", action="append", default=[], metavar="NAME=REVS",
                        help="a line of commits (repeatable; default: "
                             + ", ".join(f"{k}={v}" for k, v in DEFAULT_LINES.items()) + ")")
    parser.add_argument("--machine", default=None, help="only this asv machine (default: every one)")
    parser.add_argument("--html-dir", type=Path, default=Path("results/html"),
                        help="the published dashboard, for asv's flags (default: %(default)s)")
    parser.add_argument("--dashboard", default="", help="the dashboard's address, prefixed to the graph links")
    parser.add_argument("--md", type=Path, default=None, help="write the report here (markdown)")
    parser.add_argument("--html", type=Path, default=None, help="write the dashboard page here")
    parser.add_argument("--confirm", action="store_true",
                        help="run each timed block's confirm command (minutes each) and write its verdict in the block")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "mrcnn-bench asv report") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        lines = dict(_pair(text) for text in args.line) or DEFAULT_LINES
        found = sections(lines, args.results, args.repo, noise_by_machine(args.noise), args.dashboard, args.html_dir,
                         args.machine)
    except UsageError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.confirm:
        found = confirmed(found, args.repo)
    entries = [e for s in found for e in s.regressions]
    text = ("# Regressions in the history, ready to file\n\n" + markdown(entries)
            + work_steps.markdown([(s.line, s.machine, s.work) for s in found]) + left_out_markdown(found))
    if args.md:
        args.md.write_text(text)
    if args.html:
        args.html.write_text(page(found))
        link_from_dashboard(args.html)
    if not args.md:
        print(text)
    return 0


def confirmed(found: list[Section], repo: Path) -> list[Section]:
    """``found`` with each regression's confirm command run live and its verdict in the block."""
    blocks = [(e.command, e.pairs) for s in found for e in s.regressions]
    verdicts = iter(live_confirm.confirm_each(blocks, repo))
    return [dataclasses.replace(s, regressions=[dataclasses.replace(e, verdict=next(verdicts)) for e in s.regressions])
            for s in found]


NAV_ANCHOR = '<li id="nav-li-regressions"><a href="#/regressions">Regressions</a></li>'


def link_from_dashboard(page_file: Path) -> bool:
    """Add a "Change points" entry after asv's "Regressions" in the navigation bar of the
    ``index.html`` beside ``page_file`` (once); False when there is no such page or entry."""
    index = page_file.with_name("index.html")
    if not index.is_file():
        return False
    text = index.read_text()
    entry = f'<li id="nav-li-changes"><a href="{html.escape(page_file.name)}">Change points</a></li>'
    if entry in text:
        return True
    if NAV_ANCHOR not in text:
        return False
    index.write_text(text.replace(NAV_ANCHOR, NAV_ANCHOR + entry, 1))
    return True


def _pair(text: str) -> tuple[str, str]:
    name, sep, revs = text.partition("=")
    if not sep or not name or not revs:
        raise UsageError(f"--line {text!r}: expected NAME=REVS, e.g. main=main")
    return name, revs

