"""Deterministic commit ranges: asv-scratch and asv-steps for regression detection, asv-work for the counters.

The commits themselves are data in :mod:`mrcnn_bench.history.scratch_commits`; this module builds them. The
scratch range: seven commits on a fixed base (:data:`BASE`): four change nothing under ``mrcnn/``
("noop"), three inject one known regression each, as a source edit of the model at that commit:

- ``slowdown``: inference runs the ResNet body again over the top fifth of the canvas (about 10%
  slower, outputs bit for bit the same), as ``mrcnn_bench.running.slowdown.inject_slowdown`` did from
  outside until it convolved P3 instead;
- ``recompile``: each batch is padded tightly to its own size rounded up to ``size_divisible`` rather
  than to its canvas bucket, as ``mrcnn_bench.gates.compile_probe._inject_recompile`` does (more compiled
  graphs, same outputs; the 240x320 timing workload keeps its 320x448 canvas);
- ``accuracy``: detections decode box deltas with unit weights instead of ``cfg.bbox_reg_weights``
  (training's ``encode_boxes`` untouched).

The commits are built with git plumbing only (a temporary index, ``hash-object``, ``write-tree``,
``commit-tree``) with fixed names and dates, so every machine gets the same hashes; the working
tree, the index and HEAD are never touched, and ``refs/heads/asv-scratch`` is set with
``update-ref``. Each edit is an exact text replacement whose anchor must occur exactly once.

    mrcnn-bench asv scratch [--repo PATH]           build the range, set the branch, print it
    mrcnn-bench asv scratch [--repo PATH] --check   exit 1 unless the branch is the expected tip
    mrcnn-bench asv scratch [--repo PATH] --list    the expected commits as JSON
    mrcnn-bench asv scratch --range steps --measure-order   the order to measure them in

``--check`` and ``--list`` build the objects in a throwaway object directory: they write nothing
to the repository. Exit status 2: the base commit is missing (shallow clone) or an edit's anchor
does not match. The command line is ``mrcnn-bench asv scratch``; :mod:`mrcnn_bench.changes.asv_regressions`
names the range's commits from :func:`expected`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mrcnn_bench.base import vcs
from mrcnn_bench.history.scratch_commits import (  # noqa: F401 (re-exported: the commits belong with the range's commands)
    AUTHOR_EMAIL,
    AUTHOR_NAME,
    BASE,
    BRANCH,
    BUILT,
    COMMITS,
    NOTES,
    RANGES,
    REF,
    SCRATCH,
    STEP_COMMITS,
    STEPS,
    STEPS_BASE,
    STEPS_NOTES,
    WORK,
    WORK_NOTES,
    Append,
    Change,
    Create,
    Replace,
    ScratchCommit,
    ScratchRange,
)

# Environment variables that would redirect git away from the repository named by --repo.
_GIT_ENV = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_COMMON_DIR",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
)


class ScratchError(Exception):
    """A one-line reason the range cannot be built (exit status 2)."""


def message(index: int, commit: ScratchCommit, rng: ScratchRange = SCRATCH) -> str:
    """``{label} N/len [kind]: subject`` for the commit at 0-based ``index`` of ``rng``."""
    return f"{rng.label} {index + 1}/{len(rng.commits)} [{commit.kind}]: {commit.subject}"


def commit_env(index: int, rng: ScratchRange = SCRATCH) -> dict[str, str]:
    """Fixed author and committer for the commit at 0-based ``index``: one minute apart."""
    date = f"{rng.hour}:{index + 1:02d}:00+00:00"
    return {
        "GIT_AUTHOR_NAME": AUTHOR_NAME,
        "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": AUTHOR_NAME,
        "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
        "GIT_COMMITTER_DATE": date,
    }


class Git:
    """git in ``repo`` with a clean environment plus ``env`` (e.g. a temporary index)."""

    def __init__(self, repo: str | Path, env: dict[str, str] | None = None) -> None:
        self.repo = str(repo)
        self.env = {k: v for k, v in os.environ.items() if k not in _GIT_ENV}
        self.env.update(env or {})

    def run(self, *args: str, input: bytes | None = None, env: dict[str, str] | None = None, check: bool = True) -> str:
        try:
            result = vcs.run(self.repo, "-c", "i18n.commitEncoding=UTF-8", *args, input=input,
                             env={**self.env, **(env or {})}, check=False)
        except vcs.GitError as e:
            raise ScratchError(str(e)) from None
        if check and result.returncode != 0:
            raise ScratchError(f"git {' '.join(args)} failed: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout.decode()

    def ok(self, *args: str) -> bool:
        try:
            return vcs.run(self.repo, *args, env=self.env, check=False).returncode == 0
        except vcs.GitError:
            return False


def require_base(git: Git, rng: ScratchRange = SCRATCH) -> None:
    """ScratchError unless the range's base is a commit of the repository."""
    if not git.ok("rev-parse", "--git-dir"):
        raise ScratchError(f"{git.repo} is not a git repository")
    if not git.ok("cat-file", "-e", f"{rng.base}^{{commit}}"):
        raise ScratchError(
            f"base commit {rng.base} is not in {git.repo} (a shallow clone?): fetch the full history "
            f"(git fetch --unshallow) and run again"
        )


def apply_change(change: Change, content: str | None, where: str) -> str:
    """The new content of ``change.path`` given its content at the parent (None: absent)."""
    if isinstance(change, Create):
        if content is not None:
            raise ScratchError(f"{where}: {change.path} already exists, expected a new file")
        return change.text
    if content is None:
        raise ScratchError(f"{where}: {change.path} does not exist at the parent")
    if isinstance(change, Append):
        return content + change.text
    count = content.count(change.anchor)
    if count != 1:
        first = change.anchor.strip().splitlines()[0].strip()
        found = "is missing" if count == 0 else f"occurs {count} times"
        raise ScratchError(f"{where}: {change.path}: anchor text {first!r} {found} (expected exactly once)")
    return content.replace(change.anchor, change.text)


@contextmanager
def throwaway_objects(git: Git) -> Iterator[Git]:
    """A Git that writes new objects to a temporary directory and reads the repository's as well."""
    objects = git.run("rev-parse", "--path-format=absolute", "--git-path", "objects").strip()
    with tempfile.TemporaryDirectory(prefix="asv-scratch-objects-") as tmp:
        yield Git(git.repo, {"GIT_OBJECT_DIRECTORY": tmp, "GIT_ALTERNATE_OBJECT_DIRECTORIES": objects})


def build(git: Git, rng: ScratchRange = SCRATCH) -> list[dict[str, str]]:
    """Write the range's commits' objects with ``git`` and return ``[{hash, kind, subject}]`` in order
    (a slowdown confined to one stage also has ``stage`` and ``designed_pct``).

    Touches no ref, no working tree and no index but a temporary one.
    """
    require_base(git, rng)
    files: dict[str, str | None] = {}  # path -> content at the latest commit, for paths changed so far
    modes: dict[str, str] = {}

    def content_at_base(path: str) -> str | None:
        listing = git.run("ls-tree", rng.base, "--", path).strip()
        if not listing:
            return None
        mode, kind, blob = listing.split("\t", 1)[0].split()
        if kind != "blob":
            raise ScratchError(f"{path} is a {kind} at the base commit, expected a file")
        modes[path] = mode
        return git.run("cat-file", "blob", blob)

    out = []
    parent = rng.base
    with tempfile.TemporaryDirectory(prefix="asv-scratch-index-") as tmp:
        index_env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git.run("read-tree", rng.base, env=index_env)
        for i, commit in enumerate(rng.commits):
            msg = message(i, commit, rng)
            where = f"{rng.label} commit {i + 1}/{len(rng.commits)} [{commit.kind}]"
            for change in commit.changes:
                if change.path not in files:
                    files[change.path] = content_at_base(change.path)
                new = apply_change(change, files[change.path], where)
                files[change.path] = new
                blob = git.run("hash-object", "-w", "--stdin", input=new.encode()).strip()
                mode = modes.get(change.path, "100644")
                git.run("update-index", "--add", "--cacheinfo", f"{mode},{blob},{change.path}", env=index_env)
            tree = git.run("write-tree", env=index_env).strip()
            sha = git.run("commit-tree", "--no-gpg-sign", tree, "-p", parent, "-m", msg, env=commit_env(i, rng)).strip()
            stage = {"stage": commit.stage, "designed_pct": commit.designed_pct} if commit.stage else {}
            out.append({"hash": sha, "kind": commit.kind, "subject": msg, **stage})
            parent = sha
    return out


def expected(repo: str | Path, rng: ScratchRange = SCRATCH) -> list[dict[str, str]]:
    """The range's commits as they would be built, written to a throwaway object directory only."""
    git = Git(repo)
    require_base(git, rng)
    with throwaway_objects(git) as scratch:
        return build(scratch, rng)


def create(repo: str | Path, rng: ScratchRange = SCRATCH) -> list[dict[str, str]]:
    """Build the range in ``repo`` and point its branch at its last commit."""
    git = Git(repo)
    commits = build(git, rng)
    tip = commits[-1]["hash"]
    current = git.run("rev-parse", "--verify", "-q", rng.ref, check=False).strip()
    head = git.run("symbolic-ref", "-q", "HEAD", check=False).strip()
    if current != tip and head == rng.ref:
        raise ScratchError(f"{rng.branch} is checked out in {git.repo}; switch branches before moving it")
    if current != tip:
        git.run("update-ref", "-m", f"asv_scratch: build the {rng.label} range", rng.ref, tip,
                *([current] if current else []))
    return commits


def check(repo: str | Path, rng: ScratchRange = SCRATCH) -> tuple[bool, str]:
    """(ok, one line): whether the range's branch points at the expected last commit."""
    tip = expected(repo, rng)[-1]["hash"]
    current = Git(repo).run("rev-parse", "--verify", "-q", rng.ref, check=False).strip()
    again = f"run mrcnn-bench asv scratch --range {rng.label}"
    if not current:
        return False, f"{rng.branch} does not exist; expected {tip} ({again})"
    if current != tip:
        return False, f"{rng.branch} points to {current}, expected {tip} ({again})"
    return True, f"{rng.branch} is {tip}, as expected"


def measure_order(line: list[str], kinds: list[str]) -> list[str]:
    """The commits of ``line`` (oldest first, with their ``kinds``) in the order to measure them:
    the levels between injected commits interleaved, a commit of each in turn (base, first
    injected, second injected, the base's successor, ...). Wherever a resumable run stops, each
    level then has about the same share of measured commits, and a slow drift of the machine over
    the hours of the run cannot line up with a step."""
    levels: list[list[str]] = [[]]
    for commit, kind in zip(line, kinds, strict=True):
        if kind != "noop" and levels[-1]:
            levels.append([])
        levels[-1].append(commit)
    return [lv[i] for i in range(max(map(len, levels))) for lv in levels if i < len(lv)]


def table(commits: list[dict[str, str]]) -> str:
    width = max(len(c["kind"]) for c in commits)
    return "\n".join(f"{c['hash'][:10]}  {c['kind']:<{width}}  {c['subject']}" for c in commits)


def build_parser(prog: str = "mrcnn-bench asv scratch", default_repo: str | Path = ".") -> argparse.ArgumentParser:
    """``mrcnn-bench asv scratch``'s arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(default_repo), help="git repository (default: %(default)s)")
    parser.add_argument("--range", choices=sorted(BUILT), default="scratch",
                        help="which range: scratch (10-15%% regressions), steps (3%% and 5%% in one stage each), "
                             "work (changes of work for the exact counters; default: %(default)s)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 unless the branch is the expected tip")
    mode.add_argument("--list", action="store_true", help="print the expected commits as JSON")
    mode.add_argument("--measure-order", action="store_true",
                      help="print the range's commits (and its base, if measured) in the order to measure them, "
                           "one hash a line, for asv run HASHFILE:")
    return parser


def main(argv: list[str] | None = None, default_repo: str | Path = ".", prog: str = "mrcnn-bench asv scratch") -> int:
    """``mrcnn-bench asv scratch``'s command line; ``default_repo``: ``--repo``'s default (the script
    passes the checkout it lies in)."""
    args = build_parser(prog, default_repo).parse_args(argv)
    rng = BUILT[args.range]
    try:
        if args.list:
            print(json.dumps(expected(args.repo, rng), indent=1))
            return 0
        if args.measure_order:
            commits = expected(args.repo, rng)
            base = [{"hash": rng.base, "kind": "noop"}] if rng.with_base else []
            line = base + commits
            print("\n".join(measure_order([c["hash"] for c in line], [c["kind"] for c in line])))
            return 0
        if args.check:
            ok, line = check(args.repo, rng)
            print(line, file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        commits = create(args.repo, rng)
    except ScratchError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(table(commits))
    print(f"{rng.branch} -> {commits[-1]['hash']} (base {rng.base[:10]})")
    return 0

