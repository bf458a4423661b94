"""The commits of the deterministic asv ranges: what each one changes, as data.

:mod:`mrcnn_bench.history.scratch_range` builds them with git plumbing (the module docstring there says
how); this module only says what they are:

- the scratch range (``asv-scratch``, :data:`SCRATCH`): seven commits on 86c8714, three of them
  injecting a 10-15% slowdown, a recompilation and an accuracy loss;
- the steps range (``asv-steps``, :data:`STEPS`): 29 commits on main's 70c91c7, two of them
  slowing one stage each by about 3% and 5%;
- the work range (``asv-work``, :data:`WORK`): 12 commits on the same base for the exact work
  counters: the steps range's two injections, 1% more FLOPs in the mask head, and one more
  elementwise operator in the RPN, among commits that change nothing.

Each edit is an exact text replacement whose anchor must occur exactly once at the parent.
"""

from __future__ import annotations

from dataclasses import dataclass

BASE = "86c8714aaf37a66472cc778d24a4e42f6114104d"
BRANCH = "asv-scratch"
REF = f"refs/heads/{BRANCH}"
AUTHOR_NAME = "mrcnn scratch"
AUTHOR_EMAIL = "scratch@example.invalid"
NOTES = "scratch/NOTES.md"


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
    kind: str  # "noop", "slowdown", "recompile", "accuracy", or "work" (a change of work the counters must find)
    subject: str  # without the "scratch N/7 [kind]: " prefix
    changes: tuple[Change, ...]
    stage: str = ""  # a slowdown's stage (a key of mrcnn_bench.running.stages.STAGE_KEYS), where it is confined to one
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
        \"\"\"Scratch slowdown: in eval mode, the FPN's P3 output convolution three times more over P3.

        Only on the static model's masked path: torchvision's model (the reference, and the
        calibration of the synthetic weights) calls this module without extents. One 3x3
        convolution of the FPN's width over P3 is 1.0% of a static inference's FLOPs on the tiny
        preset's 320x448 canvas, so three are designed to cost about 3% more (two over P2, 8.0% of
        the FLOPs, measured 7.9% slower). ``abs(nan_to_num(...)) * 0`` is +0.0 whatever the values,
        yet depends on them, so no compiler drops the work; P2 - (+0.0) is P2 bit for bit.
        \"\"\"
        if self.training:
            return out
        p3 = out["1"]
        for _ in range(3):
            p3 = self.fpn.layer_blocks[1](p3)
        zero = torch.nan_to_num(p3.sum(), nan=0.0, posinf=0.0, neginf=0.0).abs() * 0.0
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
    ScratchCommit("slowdown", "the static backbone runs the FPN's P3 output convolution three times more",
                  (Replace("mrcnn/backbone.py", _BACKBONE_OLD, _BACKBONE_NEW),), stage="backbone", designed_pct=3.0),
    *(_note(k) for k in range(13, 24)),
    ScratchCommit("slowdown", "the static model's mask head runs its convolutions twice in eval mode",
                  (Replace("mrcnn/mask_head.py", _MASK_HEAD_OLD, _MASK_HEAD_NEW),), stage="mask_head",
                  designed_pct=5.0),
    *(_note(k) for k in range(25, 30)),
)
STEPS = ScratchRange("asv-steps", STEPS_BASE, STEP_COMMITS, "steps", "2026-11-27T09", with_base=True)

# --- the work range: what the exact counters must find, and only that -----------------------------
# The smallest changes of work a commit makes: one more elementwise operator in the RPN (x * 1.0 is x
# bit for bit, and its result is used), and the mask head over a fiftieth of its RoIs again after the
# steps range's doubling of the head (1% more of the doubled head's FLOPs), added as +0.0.

WORK_NOTES = "scratch/WORK.md"

_RPN_OLD = """        objectness = flatten_head_outputs(objectness_maps, 1)[..., 0]  # [B, A_total]
"""

_RPN_NEW = """        # Scratch: one more elementwise operator in the RPN; x * 1.0 is x bit for bit.
        objectness = flatten_head_outputs(objectness_maps, 1)[..., 0] * 1.0  # [B, A_total]
"""

_MASK_HEAD_MORE_OLD = """    logits = predictor(features)
"""

_MASK_HEAD_MORE_NEW = """    if not head.training:
        # Scratch: the head again over a fiftieth of the RoIs, 1% of the doubled head's FLOPs, as +0.0.
        few = head(x[: max(1, x.shape[0] // 50)]).sum()
        features = features - torch.nan_to_num(few, nan=0.0, posinf=0.0, neginf=0.0).abs() * 0.0
    logits = predictor(features)
"""


def _work_note(k: int) -> ScratchCommit:
    return ScratchCommit("noop", "note in scratch/WORK.md (no code change)",
                         (Append(WORK_NOTES, f"commit {k} changes no code\n"),))


WORK_COMMITS: tuple[ScratchCommit, ...] = (
    ScratchCommit("noop", "add scratch/WORK.md (no code change)",
                  (Create(WORK_NOTES, "asv work range: commit 1 changes no code\n"),)),
    _work_note(2),
    ScratchCommit("work", "the static backbone runs the FPN's P3 output convolution three times more",
                  (Replace("mrcnn/backbone.py", _BACKBONE_OLD, _BACKBONE_NEW),), stage="backbone"),
    _work_note(4),
    ScratchCommit("work", "one more elementwise operator in the RPN",
                  (Replace("mrcnn/rpn.py", _RPN_OLD, _RPN_NEW),), stage="rpn_rest"),
    _work_note(6),
    ScratchCommit("work", "the static model's mask head runs its convolutions twice in eval mode",
                  (Replace("mrcnn/mask_head.py", _MASK_HEAD_OLD, _MASK_HEAD_NEW),), stage="mask_head"),
    _work_note(8),
    ScratchCommit("work", "the mask head again over a fiftieth of its RoIs: 1% more of its FLOPs",
                  (Replace("mrcnn/mask_head.py", _MASK_HEAD_MORE_OLD, _MASK_HEAD_MORE_NEW),), stage="mask_head"),
    *(_work_note(k) for k in range(10, 13)),
)
WORK = ScratchRange("asv-work", STEPS_BASE, WORK_COMMITS, "work", "2026-12-03T09", with_base=True)
RANGES = {"scratch": SCRATCH, "steps": STEPS}  # the ranges asv measures: lines of the history and its report
BUILT = {**RANGES, "work": WORK}  # every range `mrcnn-bench asv scratch --range` builds
