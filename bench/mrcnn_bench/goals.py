"""The project's speed goals: per preset and case, a multiple of another case's median, in one run."""

from __future__ import annotations

from mrcnn_bench.cases import REFERENCE, TRAIN_REFERENCE

# Median latency (or step time) as a multiple of another case's, in one interleaved run. COCO
# size: the inference-speed goals for ResNet-50 FPN at 480x640 (eager 0.85x torchvision eager,
# inductor 0.5x, bf16 0.3x, XLA:CPU 0.6x, AOTInductor 0.55x) and the training-speed goals (static
# inductor >= 1.2x torchvision eager's images/s, with mask-RoI buckets too, and >= 1.8x under bf16
# autocast); tiny: eager at most torchvision's, inductor 0.75x, XLA within 1.5x of static eager,
# the same training goals. The report names each goal beside the row and explains the column
# (run_notes.notes); presets not named here take the tiny preset's.
TRAIN_SPEEDUP = 1.2  # static inductor training images/s over torchvision eager's
TRAIN_SPEEDUP_BF16 = 1.8  # the same under bf16 autocast, still over torchvision eager fp32's
_TRAIN_TARGETS = {
    "static/inductor-train": (TRAIN_REFERENCE, 1 / TRAIN_SPEEDUP),
    "static/inductor-train+buckets": (TRAIN_REFERENCE, 1 / TRAIN_SPEEDUP),
    "static/inductor-bf16-train+buckets": (TRAIN_REFERENCE, 1 / TRAIN_SPEEDUP_BF16),
}
SPEED_TARGETS: dict[str, dict[str, tuple[str, float]]] = {
    "coco_r50_fpn": {
        "static/eager": (REFERENCE, 0.85),
        "static/inductor": (REFERENCE, 0.5),
        "static/inductor-bf16": (REFERENCE, 0.3),
        "static/xla": (REFERENCE, 0.6),
        "static/aoti": (REFERENCE, 0.55),
        **_TRAIN_TARGETS,
    },
    "tiny": {
        "static/eager": (REFERENCE, 1.0),
        "static/inductor": (REFERENCE, 0.75),
        "static/xla": ("static/eager", 1.5),
        **_TRAIN_TARGETS,
    },
}


def speed_target(case: str, preset: str) -> tuple[str, float] | None:
    """``(base case, factor)``: the row's goal, at most ``factor`` times ``base``'s median; None: no goal."""
    return SPEED_TARGETS.get(preset, SPEED_TARGETS["tiny"]).get(case)
