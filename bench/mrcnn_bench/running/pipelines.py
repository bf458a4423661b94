"""Pipelines: one call of a case, built from a model by the builder registered for its compiler.

An inference call turns ``batch_size`` images into torchvision-style ``list[dict]`` (resize, pad,
forward, box rescale and mask pasting included). A training call is one SGD step (forward,
backward, update) on ``TRAIN_BATCH`` images with their targets.

The model (:data:`MODELS`, by implementation) is built, moved to the backend's device and, for a
variant with a slowdown, hooked (:func:`mrcnn_bench.running.slowdown.inject_slowdown`); then the builder
of the case's compiler (:data:`PIPELINES`, by name) turns it into the forward that is timed. A
new way of compiling is one more builder::

    @register_pipeline("my_compiler")
    def build_mine(model: nn.Module, case: Case, slowdown: float) -> Compiled: ...

Implementations and compilers registered by users' modules (:func:`mrcnn_bench.running.cases.add_case`)
name their builders as ``"module:function"``; they are imported when a row first needs them.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from mrcnn.config import Config
from mrcnn.data.collate import collate
from mrcnn.model import MaskRCNN
from mrcnn.postprocess import postprocess
from mrcnn.reference import torchvision_model
from mrcnn.structures import Detections, ImageBatch, Targets
from mrcnn.transform import to_image_batch
from mrcnn.weights import load_torchvision_weights
from mrcnn_bench.base.errors import UsageError
from mrcnn_bench.running import backends
from mrcnn_bench.running.cases import COMPILERS, IMPLEMENTATIONS, TRAIN_BATCH, Case, Row
from mrcnn_bench.running.context import Context, Sample
from mrcnn_bench.running.slowdown import inject_slowdown

Outputs = list[dict[str, Tensor]]  # torchvision-style, one dict per image (boxes, labels, scores, masks)

# The reference settings of torchvision's training recipe, at the lr of a batch of 2.
SGD_LR, SGD_MOMENTUM, SGD_WEIGHT_DECAY = 0.002, 0.9, 1e-4


@dataclass
class Compiled:
    """What a builder makes of a model: the forward to time, and the compiler's own counters."""

    forward: Callable[..., Any]  # same arguments and result as the model's forward
    counters: Callable[[], dict[str, float]] = dict  # process-wide, absolute; {} when it has none


Builder = Callable[[nn.Module, Case, float], Compiled]  # (model on its device, case, slowdown) -> Compiled
PIPELINES: dict[str, Builder] = {}


def register_pipeline(name: str) -> Callable[[Builder], Builder]:
    """Register a builder under the compiler name ``name`` (a case's ``compiler`` field)."""

    def register(builder: Builder) -> Builder:
        if name in PIPELINES:
            raise ValueError(f"a pipeline named {name!r} is already registered")
        PIPELINES[name] = builder
        return builder

    return register


def _staged(model: nn.Module, case: Case) -> bool:
    """A static case whose config has mask buckets for its phase: the forward to time is the two
    stages of ``mrcnn.staged`` (first stage, host read of the counts, mask branch on a bucket), as
    ``MaskRCNN.predict`` and the library's training run them, rather than the single graph.
    Inference: :func:`inference_staged`; training: set ``mask_train_buckets``."""
    cfg = getattr(model, "cfg", None)
    if case.interface != "static" or cfg is None:
        return False
    if case.phase == "training":
        # "auto": the eager forward packs the slots itself, and compiled rows keep the one graph.
        return _set_buckets(model, "mask_train_buckets")
    return inference_staged(cfg, case, next(model.parameters()).device)


def inference_staged(cfg: Config, case: Case, device: torch.device) -> bool:
    """Whether a static inference row on ``device`` runs the mask branch staged: set
    ``mask_detection_buckets`` always; "auto" as ``predict`` resolves it there, with the compiled
    rows kept on the one graph (the tracked series)."""
    buckets = getattr(cfg, "mask_detection_buckets", ())
    if buckets == "auto":
        # Imported here: only a checkout with "auto" reaches it, and such a checkout has it.
        from mrcnn.staged import stages_masks

        return stages_masks(cfg, device, compiled=case.compiler != "eager")
    return bool(buckets)


def _set_buckets(model: nn.Module, field: str = "mask_detection_buckets") -> bool:
    """Whether the config names buckets of its own in ``field`` (not empty, not the default "auto")."""
    buckets = getattr(getattr(model, "cfg", None), field, ())
    return bool(buckets) and buckets != "auto"


def _staged_forward(model: nn.Module, case: Case, compiled: bool, warm_ahead: bool) -> Callable[..., Any]:
    """``warm_ahead``: every bucket's graph of a canvas is built at its first call (compiled and XLA
    rows), so the graphs a row builds, and whether one is built in a timed round, never depend on
    how many objects the images hold."""
    if case.phase == "training":
        # Imported here: a checkout compared against (worker rows import its mrcnn) may predate
        # it, and only configs with mask_train_buckets, which such a checkout rejects, reach this.
        from mrcnn.staged import StagedTrainer as Staged
    else:
        try:
            # Imported here: as above, for configs with mask_detection_buckets.
            from mrcnn.staged import StagedDetector as Staged
        except ImportError:
            # Imported here: checkouts from before mrcnn.staged kept the class in mrcnn.model.
            from mrcnn.model import StagedDetector as Staged  # type: ignore[attr-defined,no-redef]
    return Staged.compiled(model, warm_ahead) if compiled else Staged(model, warm_ahead=warm_ahead)


def _telling_fills_canvas(model: nn.Module, forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` told, at each call, whether the batch fills its canvas (read on the host:
    :func:`mrcnn.backbone.fills_canvas`), so that its graph skips the padding masks when no image
    needs them: one more graph per canvas at most. A checkout whose model has no such argument
    (compared against, its mrcnn imported by the worker) gets ``forward`` as it is."""
    if "fills_canvas" not in inspect.signature(model.forward).parameters:
        return forward
    # Imported here: only checkouts whose forward takes the argument have it.
    from mrcnn.backbone import fills_canvas

    size_divisible = model.cfg.size_divisible

    def told(batch: ImageBatch, *rest: Any) -> Any:
        return forward(batch, *rest, fills_canvas=fills_canvas(batch, size_divisible, model.training))

    return told


@register_pipeline("eager")
def build_eager(model: nn.Module, case: Case, slowdown: float) -> Compiled:
    """The model as it is (on XLA, traced lazily). With mask buckets, its two stages."""
    if _staged(model, case):
        return Compiled(_staged_forward(model, case, compiled=False, warm_ahead=case.backend == "xla"))
    return Compiled(model)


@register_pipeline("inductor")
def build_inductor(model: nn.Module, case: Case, slowdown: float) -> Compiled:
    """torch.compile. Static inference and every training forward in one graph (fullgraph);
    torchvision's inference breaks graphs by design. Backward goes through AOTAutograd. With mask
    buckets, the static model compiles each stage instead (fullgraph, static shapes): one graph per
    canvas for the first stage, one per (canvas, bucket) for the mask stage, all built at a
    canvas's first call."""
    if _staged(model, case):
        return Compiled(_staged_forward(model, case, compiled=True, warm_ahead=True), backends.dynamo_counters)
    if case.interface == "static":
        # dynamic=False: one specialised graph per canvas and fills_canvas value. By default dynamo
        # turns the canvas's height and width into symbols at the first recompile, and one graph
        # with dynamic shapes then serves several canvases (3 graphs for the 5 canvases of a stream).
        compiled = torch.compile(model, fullgraph=True, dynamic=False)
        return Compiled(_telling_fills_canvas(model, compiled), backends.dynamo_counters)
    fullgraph = case.phase == "training"
    return Compiled(torch.compile(model, fullgraph=fullgraph), backends.dynamo_counters)


@register_pipeline("frozen")
def build_frozen(model: nn.Module, case: Case, slowdown: float) -> Compiled:
    """Inductor with freezing (:class:`mrcnn.frozen.FrozenInference`: the weights constants of the
    graphs), inference only. Static: one graph per canvas, as the inductor row; torchvision with its
    graph breaks and dynamo's default shapes, as its inductor row."""
    if _set_buckets(model):
        raise UsageError("the frozen rows compile the single graph; mask_detection_buckets: run them without it")
    try:
        # Imported here: a checkout compared against (worker rows import its mrcnn) may predate it.
        from mrcnn.frozen import FrozenInference
    except ImportError:
        raise UsageError("this checkout's mrcnn has no mrcnn.frozen: the frozen rows cannot run on it") from None
    static = case.interface == "static"
    frozen = FrozenInference(model, fullgraph=static, dynamic=False if static else None)
    return Compiled(frozen, backends.dynamo_counters)


def _build_deployed(model: nn.Module, fmt: str, slowdown: float) -> Compiled:
    if _set_buckets(model):
        raise UsageError(
            f"the {fmt} rows deploy the single graph (one package per canvas); mask_detection_buckets "
            "has no deployed form: run these rows without it"
        )
    # Imported here: only these rows need the export stack, and a checkout compared against
    # (worker rows import its mrcnn) may not have it.
    from mrcnn_bench.running.deploy import DeployOnFirstCall

    deploy = DeployOnFirstCall(model, fmt)
    exported = getattr(deploy, "model", model)
    if slowdown and exported is not model:
        # It exports a copy with the pure-tensor ops, which does not carry the model's hooks.
        inject_slowdown(exported, slowdown)
    return Compiled(deploy, deploy.counters)


@register_pipeline("export")
def build_export(model: nn.Module, case: Case, slowdown: float) -> Compiled:
    """torch.export at the first call of each canvas (time to first result includes it)."""
    return _build_deployed(model, "exported", slowdown)


@register_pipeline("aoti")
def build_aoti(model: nn.Module, case: Case, slowdown: float) -> Compiled:
    """torch.export + AOTInductor at the first call of each canvas."""
    return _build_deployed(model, "aoti", slowdown)


def _static_eager_channels_last(case: Case, cfg: Config, device: torch.device) -> bool:
    """Whether the static model would run ``case``'s convolutions in channels_last with ``cfg`` on
    ``device``: eager cases only (compiled, the compiler picks the layout for both models)."""
    if case.compiler != "eager":
        return False
    try:
        # Imported here: a checkout compared against (worker rows import its mrcnn) may predate it,
        # when channels_last was a plain bool and False by default.
        from mrcnn.layout import channels_last_on
    except ImportError:
        return getattr(cfg, "channels_last", False) is True and device.type in ("cpu", "cuda")
    return channels_last_on(cfg, device)


def build_static(cfg: Config, weights: dict[str, Tensor]) -> nn.Module:
    return load_torchvision_weights(MaskRCNN(cfg), weights)


def build_torchvision(cfg: Config, weights: dict[str, Tensor]) -> nn.Module:
    model = torchvision_model(cfg)
    model.load_state_dict(weights)
    return model


# Implementation -> (config, torchvision-named state_dict) -> model.
MODELS: dict[str, Callable[[Config, dict[str, Tensor]], nn.Module]] = {
    "static": build_static,
    "torchvision": build_torchvision,
}


def _resolve(path: str, what: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UsageError(f"{what} builder {path!r} cannot be loaded ({type(e).__name__}: {e})") from None


def model_builder(impl: str) -> Callable[[Config, dict[str, Tensor]], nn.Module]:
    """The builder of an implementation: built in, or a user's ``module:function``."""
    return MODELS.get(impl) or _resolve(IMPLEMENTATIONS[impl].builder, f"implementation {impl!r}")


def compiler_builder(compiler: str) -> Builder:
    """The builder of a compiler: built in, or a user's ``module:function``."""
    return PIPELINES.get(compiler) or _resolve(COMPILERS[compiler], f"compiler {compiler!r}")


def compact(outputs: Outputs) -> Outputs:
    """CPU copies with masks thresholded to bool: 1/4 of the memory, same parity statistics."""
    out = []
    for d in outputs:
        c = {k: v.detach().cpu() for k, v in d.items() if k != "masks"}
        if "masks" in d:
            m = d["masks"].detach().cpu()
            c["masks"] = m if m.dtype == torch.bool else m > 0.5
        out.append(c)
    return out


class Pipeline:
    """A built case: ``call(index)`` runs call ``index`` (inference: compact outputs; training: losses)."""

    def __init__(self, row: Row, ctx: Context) -> None:
        self.row, self.ctx = row, ctx
        self.case = row.case
        self.cfg = ctx.config(row.variant, row.case.overrides)
        self.device = backends.device(self.case.backend)
        self.model: nn.Module | None = None
        self._compiled: Compiled | None = None
        self._fn: Callable[[int], Any] | None = None
        self._infer: Callable[[list[Tensor]], Outputs] | None = None

    def setup(self) -> None:
        """Build the model and its forward; nothing is run yet."""
        case, ctx, slowdown = self.case, self.ctx, self.row.variant.slowdown
        torch.manual_seed(ctx.seed)
        training = case.phase == "training"
        model = model_builder(case.impl)(self.cfg, ctx.train_weights if training else ctx.weights)
        self.model = model = model.train(training).to(self.device)
        if case.interface == "torchvision" and _static_eager_channels_last(case, self.cfg, self.device):
            # torchvision's transform hands the backbone NCHW images, and oneDNN and cuDNN take the
            # layout from the conv weights. A comparison then measures the models, not the layout.
            model.to(memory_format=torch.channels_last)
        if slowdown:
            inject_slowdown(model, slowdown)
        self._compiled = compiler_builder(case.compiler)(model, case, slowdown)
        forward = self._compiled.forward
        if training:
            self._fn = self._training_step(forward)
            return
        wrap = self._torchvision_inference if case.interface == "torchvision" else self._static_inference
        self._infer = wrap(forward)
        self._fn = lambda index: self.infer(ctx.call_images(index))

    def call(self, index: int) -> Any:
        assert self._fn is not None, "setup() first"
        return self._fn(index)

    def infer(self, images: list[Tensor]) -> Outputs:
        """Inference cases: any list of images -> compact torchvision-style outputs."""
        assert self._infer is not None, "an inference case, after setup()"
        return self._infer(images)

    def counters(self) -> dict[str, float]:
        """Compile counters of this row's backend or compiler (process-wide, absolute)."""
        if self.case.backend == "xla":
            return backends.xla_counters()
        return self._compiled.counters() if self._compiled is not None else {}

    # -- inference -------------------------------------------------------------------------------

    def _autocast(self) -> torch.autocast:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.case.precision == "bf16")

    def _static_inference(self, forward: Callable[[ImageBatch], Detections]) -> Callable[[list[Tensor]], Outputs]:
        """images -> host transform -> (device) forward -> sync -> CPU -> postprocess."""
        cfg, dev = self.cfg, self.device

        def run(images: list[Tensor]) -> Outputs:
            with torch.no_grad():
                # Transform on the host: on XLA, resizing each original size would compile anew.
                batch = to_image_batch(images, cfg)
                with self._autocast():
                    det = forward(ImageBatch(*(t.to(dev) for t in batch)))
                backends.sync(dev)
                det = Detections(*(t.float().cpu() if t.is_floating_point() else t.cpu() for t in det))
            return compact(postprocess(det, batch))

        return run

    def _torchvision_inference(self, forward: Callable[[list[Tensor]], Outputs]) -> Callable[[list[Tensor]], Outputs]:
        """images -> device -> torchvision MaskRCNN (its own transform and postprocess) -> sync -> CPU."""
        dev = self.device

        def run(images: list[Tensor]) -> Outputs:
            with torch.no_grad(), self._autocast():
                outputs = forward([img.to(dev) for img in images])
            backends.sync(dev)
            return compact([{k: v.float() if v.is_floating_point() else v for k, v in o.items()} for o in outputs])

        return run

    # -- training --------------------------------------------------------------------------------

    def _training_step(self, forward: Callable[..., dict[str, Tensor]]) -> Callable[[int], dict[str, float]]:
        """One SGD step (torchvision reference settings, lr 0.002) on the run's training samples.

        The samples form batches of ``TRAIN_BATCH`` in order; call ``index`` steps on batch
        ``index % batches`` (timed runs hold one batch; the gate's probe one per ground-truth mix).
        """
        dev, samples = self.device, self.ctx.train_samples
        assert self.model is not None
        # Built here rather than by the library's training code, whose layout differs between the
        # commits that compare runs: one group over the trainable parameters, decay on all.
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=SGD_LR, momentum=SGD_MOMENTUM, weight_decay=SGD_WEIGHT_DECAY)
        if not samples:
            raise UsageError(f"{self.case.name}: a training row needs training samples (none in the run's context)")
        batches = [samples[i : i + TRAIN_BATCH] for i in range(0, len(samples), TRAIN_BATCH)]
        inputs = [self._training_inputs(b) for b in batches]

        def step(index: int) -> dict[str, float]:
            optimizer.zero_grad(set_to_none=True)
            with self._autocast():
                losses = forward(*inputs[index % len(inputs)])
            total = sum(losses.values())
            total.backward()
            optimizer.step()
            backends.sync(dev)
            # A copy, not float() of the device tensor: on XLA, .item() runs as a CPU fallback op
            # (aten::_local_scalar_dense), which the row would count as the model's.
            return {"loss": float(total.detach().cpu())}

        return step

    def _training_inputs(self, samples: list[Sample]) -> tuple[Any, ...]:
        """A batch of samples -> the model's training arguments on the device."""
        dev = self.device
        if self.case.interface == "torchvision":
            images = [img.float().div(255).to(dev) for img, _ in samples]
            targets = [{k: t[k].to(dev) for k in ("boxes", "labels", "masks")} for _, t in samples]
            return images, targets
        batch, targets_, _ = collate(samples, self.cfg)
        return ImageBatch(*(t.to(dev) for t in batch)), Targets(*(t.to(dev) for t in targets_))
