"""A deterministic scratch commit range for asv's regression detection: ``asv-scratch``.

Seven commits on a fixed base (:data:`BASE`): four change nothing under ``mrcnn/`` ("noop"), three
inject one known regression each, as a source edit of the model at that commit:

- ``slowdown``: inference runs the ResNet body again over the top fifth of the canvas (about 10%
  slower, outputs bit for bit the same), as ``mrcnn_bench.slowdown.inject_slowdown`` does from outside;
- ``recompile``: each batch is padded tightly to its own size rounded up to ``size_divisible`` rather
  than to its canvas bucket, as ``mrcnn_bench.compile_probe._inject_recompile`` does (more compiled
  graphs, same outputs; the 240x320 timing workload keeps its 320x448 canvas);
- ``accuracy``: detections decode box deltas with unit weights instead of ``cfg.bbox_reg_weights``
  (training's ``encode_boxes`` untouched).

The commits are built with git plumbing only (a temporary index, ``hash-object``, ``write-tree``,
``commit-tree``) with fixed names and dates, so every machine gets the same hashes; the working
tree, the index and HEAD are never touched, and ``refs/heads/asv-scratch`` is set with
``update-ref``. Each edit is an exact text replacement whose anchor must occur exactly once.

    python bench/tools/asv_scratch.py [--repo PATH]           build the range, set the branch, print it
    python bench/tools/asv_scratch.py [--repo PATH] --check   exit 1 unless the branch is the expected tip
    python bench/tools/asv_scratch.py [--repo PATH] --list    the expected commits as JSON

``--check`` and ``--list`` build the objects in a throwaway object directory: they write nothing
to the repository. Exit status 2: the base commit is missing (shallow clone) or an edit's anchor
does not match. The command line is ``bench/tools/asv_scratch.py``; :mod:`mrcnn_bench.asv_regressions`
names the range's commits from :func:`expected`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

BASE = "86c8714aaf37a66472cc778d24a4e42f6114104d"
BRANCH = "asv-scratch"
REF = f"refs/heads/{BRANCH}"
AUTHOR_NAME = "mrcnn scratch"
AUTHOR_EMAIL = "scratch@example.invalid"
NOTES = "scratch/NOTES.md"

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


@dataclass(frozen=True)
class Replace:
    """Replace the one occurrence of ``anchor`` in ``path`` with ``text``."""

    path: str
    anchor: str
    text: str


@dataclass(frozen=True)
class Create:
    """Add ``path`` (absent at the parent) with content ``text``."""

    path: str
    text: str


@dataclass(frozen=True)
class Append:
    """Append ``text`` to ``path`` (present at the parent)."""

    path: str
    text: str


Change = Replace | Create | Append


@dataclass(frozen=True)
class ScratchCommit:
    kind: str  # "noop", "slowdown", "recompile" or "accuracy"
    subject: str  # without the "scratch N/7 [kind]: " prefix
    changes: tuple[Change, ...]
    stage: str = ""  # a slowdown's stage (a key of mrcnn_bench.profile.STAGE_KEYS), where it is confined to one
    designed_pct: float = 0.0  # a slowdown's designed size: percent more time per static eager inference


# --- commit 2: the slowdown ---------------------------------------------------------------------

_FEATURES_OLD = """\
        if not self.cfg.mask_padding:
            features = list(self.backbone(batch.tensors).values())
            return features, features[:4], None
        canvas = (batch.tensors.shape[-2], batch.tensors.shape[-1])
        extents = padded_extents(batch.image_sizes, self.cfg.size_divisible)
        if self.training:
            # torchvision trains on batches padded to the largest image's extent, so each image's
            # losses depend on that; inference matches torchvision running each image alone.
            largest = torch.where(batch.valid[:, None], extents, 0).amax(0, keepdim=True)
            extents = largest.expand_as(extents)
        features = list(self.backbone(batch.tensors, extents).values())  # P2..P6
        return features, [edge_extended(f, extents, canvas) for f in features[:4]], extents
"""

_FEATURES_NEW = """\
        if not self.cfg.mask_padding:
            features = self.extra_work(list(self.backbone(batch.tensors).values()), batch.tensors)
            return features, features[:4], None
        canvas = (batch.tensors.shape[-2], batch.tensors.shape[-1])
        extents = padded_extents(batch.image_sizes, self.cfg.size_divisible)
        if self.training:
            # torchvision trains on batches padded to the largest image's extent, so each image's
            # losses depend on that; inference matches torchvision running each image alone.
            largest = torch.where(batch.valid[:, None], extents, 0).amax(0, keepdim=True)
            extents = largest.expand_as(extents)
        features = self.extra_work(list(self.backbone(batch.tensors, extents).values()), batch.tensors)  # P2..P6
        return features, [edge_extended(f, extents, canvas) for f in features[:4]], extents

    def extra_work(self, features: list[Tensor], images: Tensor) -> list[Tensor]:
        \"\"\"Scratch slowdown: in eval mode, the ResNet body again over the top fifth of the canvas.

        The body is about half of the inference forward, so a fifth of its rows costs about 10%
        more. ``abs(nan_to_num(...)) * 0`` is +0.0 whatever the values, yet depends on them, so no
        compiler drops the work; P2 - (+0.0) is P2 bit for bit (-0.0 included).
        \"\"\"
        if self.training:
            return features
        rows = round(0.2 * images.shape[-2])  # a Python int from the canvas: a static shape
        levels = self.backbone.body(images[..., :rows, :])  # OrderedDict of ResNet stages
        total = list(levels.values())[-1].sum()
        zero = torch.nan_to_num(total, nan=0.0, posinf=0.0, neginf=0.0).abs() * 0.0
        return [features[0] - zero, *features[1:]]
"""

# --- commit 4: the recompile --------------------------------------------------------------------

_CANVAS_OLD = """\
    canvas_h, canvas_w = select_canvas([tuple(r.shape[-2:]) for r in resized], cfg)
"""

_CANVAS_NEW = """\
    sizes = [tuple(r.shape[-2:]) for r in resized]
    select_canvas(sizes, cfg)  # still rejects images that no bucket holds
    # Scratch recompile: pad tightly, as torchvision does, to the batch's size rounded up to
    # size_divisible instead of to its canvas bucket: one compiled graph per padded size.
    d = cfg.size_divisible
    canvas_h, canvas_w = max(-(-h // d) * d for h, _ in sizes), max(-(-w // d) * d for _, w in sizes)
"""

# --- commit 6: the accuracy loss ----------------------------------------------------------------

_DECODE_OLD = "decode_boxes(deltas, proposals.boxes, cfg.bbox_reg_weights)"
_DECODE_NEW = "decode_boxes(deltas, proposals.boxes, (1.0, 1.0, 1.0, 1.0))"

COMMITS: tuple[ScratchCommit, ...] = (
    ScratchCommit(
        "noop",
        "add scratch/NOTES.md (no code change)",
        (Create(NOTES, "asv scratch range: commit 1 changes no code\n"),),
    ),
    ScratchCommit(
        "slowdown",
        "inference runs the ResNet body again over a fifth of the canvas",
        (Replace("mrcnn/model.py", _FEATURES_OLD, _FEATURES_NEW),),
    ),
    ScratchCommit(
        "noop",
        "note in scratch/NOTES.md (no code change)",
        (Append(NOTES, "commit 3 changes no code\n"),),
    ),
    ScratchCommit(
        "recompile",
        "pad each batch tightly to size_divisible instead of to its canvas bucket",
        (Replace("mrcnn/transform.py", _CANVAS_OLD, _CANVAS_NEW),),
    ),
    ScratchCommit(
        "noop",
        "note in scratch/NOTES.md (no code change)",
        (Append(NOTES, "commit 5 changes no code\n"),),
    ),
    ScratchCommit(
        "accuracy",
        "detections decode boxes with unit weights instead of bbox_reg_weights",
        (Replace("mrcnn/roi_heads.py", _DECODE_OLD, _DECODE_NEW),),
    ),
    ScratchCommit(
        "noop",
        "note in scratch/NOTES.md (no code change)",
        (Append(NOTES, "commit 7 changes no code\n"),),
    ),
)


@dataclass(frozen=True)
class ScratchRange:
    """A deterministic range: its commits on ``base``, on branch ``branch``; commit ``i`` is dated
    ``{hour}:{i + 1:02d}`` (one minute apart, after the base's own date so that a date axis draws the
    range after it) and its subject starts ``{label} N/len [kind]: ``."""

    branch: str
    base: str
    commits: tuple[ScratchCommit, ...]
    label: str
    hour: str  # ISO date and hour, e.g. 2026-11-23T15
    with_base: bool = False  # the base is measured too, as the first point of the line

    @property
    def ref(self) -> str:
        return f"refs/heads/{self.branch}"

    @property
    def revs(self) -> str:
        """The line of commits as ``git rev-list`` takes it: the range, and its base if measured."""
        return f"{self.branch}~{len(self.commits)}{'^' if self.with_base else ''}..{self.branch}"


SCRATCH = ScratchRange(BRANCH, BASE, COMMITS, "scratch", "2026-11-23T15")

# --- the steps range: small slowdowns confined to one stage each ---------------------------------
# On main's tip of 2026-11-27 (the harness's shared rounds), so the model is the one main measures.
# A 3% step in the backbone and a 5% step in the mask head, among commits that change nothing; the
# base is the first point. The levels are 12, 12 and 6 commits long: at an A/A coefficient of
# variation near 1.5%, a t-test at p < 0.001 (the change-point method's) separates a 3% step only
# with about 10 or more commits on either side, a 5% step with 4. Each slowdown runs real work in
# the static model's own call of the stage's module (so its forward hook times it) whose result is
# added as +0.0: the outputs stay bit for bit the same and no compiler can drop the work.

STEPS_BASE = "70c91c717863c957b481019a547e2f96f43b9bc3"
STEPS_NOTES = "scratch/STEPS.md"

_BACKBONE_OLD = """\
        if extents is None:
            return super().forward(x)
        return dict(zip(("0", "1", "2", "3", "pool"), masked_features(self, x, extents), strict=True))
"""

_BACKBONE_NEW = """\
        if extents is None:
            return super().forward(x)
        out = dict(zip(("0", "1", "2", "3", "pool"), masked_features(self, x, extents), strict=True))
        return self.extra_work(out)

    def extra_work(self, out: dict[str, Tensor]) -> dict[str, Tensor]:
        \"\"\"Scratch slowdown: in eval mode, the FPN's P2 output convolution twice more over P2.

        Only on the static model's masked path: torchvision's model (the reference, and the
        calibration of the synthetic weights) calls this module without extents. Two 3x3
        convolutions of the FPN's width over the largest level are designed to cost about 3% more
        per static eager inference on the tiny preset. ``abs(nan_to_num(...)) * 0`` is +0.0
        whatever the values, yet depends on them, so no compiler drops the work; P2 - (+0.0) is P2
        bit for bit.
        \"\"\"
        if self.training:
            return out
        again = self.fpn.layer_blocks[0](self.fpn.layer_blocks[0](out["0"])).sum()
        zero = torch.nan_to_num(again, nan=0.0, posinf=0.0, neginf=0.0).abs() * 0.0
        return {k: v - zero if k == "0" else v for k, v in out.items()}
"""

# The static model's mask branch (torchvision's model calls the head itself, not through here).
_MASK_HEAD_OLD = """\
    logits = predictor(head(conv_layout(pooled.flatten(0, 1), cfg)))  # RoIAlign writes NCHW
"""

_MASK_HEAD_NEW = """\
    x = conv_layout(pooled.flatten(0, 1), cfg)  # RoIAlign writes NCHW
    features = head(x)
    if not head.training:
        # Scratch slowdown: the mask head's convolutions again on the same RoIs. The head is about
        # a twentieth of a static eager inference, so this is designed to cost about 5% more; the
        # second result is added as +0.0, so the outputs are bit for bit the same.
        again = head(x).sum()
        features = features - torch.nan_to_num(again, nan=0.0, posinf=0.0, neginf=0.0).abs() * 0.0
    logits = predictor(features)
"""


def _note(k: int) -> ScratchCommit:
    change = Append(STEPS_NOTES, f"commit {k} changes no code\n")
    return ScratchCommit("noop", "note in scratch/STEPS.md (no code change)", (change,))


STEP_COMMITS: tuple[ScratchCommit, ...] = (
    ScratchCommit("noop", "add scratch/STEPS.md (no code change)",
                  (Create(STEPS_NOTES, "asv steps range: commit 1 changes no code\n"),)),
    *(_note(k) for k in range(2, 12)),
    ScratchCommit("slowdown", "the static backbone runs the FPN's P2 output convolution twice more",
                  (Replace("mrcnn/backbone.py", _BACKBONE_OLD, _BACKBONE_NEW),), stage="backbone", designed_pct=3.0),
    *(_note(k) for k in range(13, 24)),
    ScratchCommit("slowdown", "the static model's mask head runs its convolutions twice in eval mode",
                  (Replace("mrcnn/mask_head.py", _MASK_HEAD_OLD, _MASK_HEAD_NEW),), stage="mask_head",
                  designed_pct=5.0),
    *(_note(k) for k in range(25, 30)),
)
STEPS = ScratchRange("asv-steps", STEPS_BASE, STEP_COMMITS, "steps", "2026-11-27T09", with_base=True)
RANGES = {"scratch": SCRATCH, "steps": STEPS}


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
        result = subprocess.run(
            ["git", "-C", self.repo, "-c", "i18n.commitEncoding=UTF-8", *args],
            input=input,
            capture_output=True,
            env={**self.env, **(env or {})},
        )
        if check and result.returncode != 0:
            raise ScratchError(f"git {' '.join(args)} failed: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout.decode()

    def ok(self, *args: str) -> bool:
        return subprocess.run(["git", "-C", self.repo, *args], capture_output=True, env=self.env).returncode == 0


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
    again = f"run python bench/tools/asv_scratch.py --range {rng.label}"
    if not current:
        return False, f"{rng.branch} does not exist; expected {tip} ({again})"
    if current != tip:
        return False, f"{rng.branch} points to {current}, expected {tip} ({again})"
    return True, f"{rng.branch} is {tip}, as expected"


def table(commits: list[dict[str, str]]) -> str:
    width = max(len(c["kind"]) for c in commits)
    return "\n".join(f"{c['hash'][:10]}  {c['kind']:<{width}}  {c['subject']}" for c in commits)


def main(argv: list[str] | None = None, default_repo: str | Path = ".") -> int:
    """``bench/tools/asv_scratch.py``'s command line; ``default_repo``: ``--repo``'s default (the script
    passes the checkout it lies in)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", default=str(default_repo), help="git repository")
    parser.add_argument("--range", choices=sorted(RANGES), default="scratch",
                        help="which range: scratch (10-15%% regressions), steps (3%% and 5%% in one stage each)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="exit 1 unless the branch is the expected tip")
    mode.add_argument("--list", action="store_true", help="print the expected commits as JSON")
    args = parser.parse_args(argv)
    rng = RANGES[args.range]
    try:
        if args.list:
            print(json.dumps(expected(args.repo, rng), indent=1))
            return 0
        if args.check:
            ok, line = check(args.repo, rng)
            print(line, file=sys.stdout if ok else sys.stderr)
            return 0 if ok else 1
        commits = create(args.repo, rng)
    except ScratchError as e:
        print(f"asv_scratch: {e}", file=sys.stderr)
        return 2
    print(table(commits))
    print(f"{rng.branch} -> {commits[-1]['hash']} (base {rng.base[:10]})")
    return 0

