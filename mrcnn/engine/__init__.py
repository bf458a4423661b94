"""Training engine: :func:`train` runs a :class:`Trainer` over a :class:`TrainConfig`.

One job per module: ``config`` (the settings), ``schedule`` (optimiser and LR schedule),
``distributed`` (process group and collectives), ``checkpoint`` (files and RNG state), ``data``
(synthetic data and per-epoch loaders), ``build`` (initial model), ``precision`` (AMP),
``adapters`` (static model vs torchvision's), ``evaluation`` (COCO metrics), ``trainer`` (the
loop), ``hooks`` (checkpoints, evaluation, metrics file, progress bar) and ``launch`` (a whole run).
"""

from mrcnn.engine.adapters import Adapter, StaticAdapter, TorchvisionAdapter, TorchvisionCollate, make_adapter
from mrcnn.engine.build import build_model, zero_residual_init
from mrcnn.engine.checkpoint import checkpoint_path, latest_checkpoint, load_checkpoint
from mrcnn.engine.config import AMP_MODES, IMPLS, INITS, OPTIMIZERS, TrainConfig, TrainSetupError
from mrcnn.engine.data import ensure_synthetic
from mrcnn.engine.evaluation import evaluate, evaluate_torchvision
from mrcnn.engine.hooks import METRICS_FILE
from mrcnn.engine.launch import TrainResult, train
from mrcnn.engine.schedule import WarmupMultiStep, build_optimizer, build_scheduler
from mrcnn.engine.trainer import LOSS_NAMES, Hook, NonFiniteLossError, Trainer, TrainState

__all__ = [
    "AMP_MODES",
    "IMPLS",
    "INITS",
    "LOSS_NAMES",
    "METRICS_FILE",
    "OPTIMIZERS",
    "Adapter",
    "Hook",
    "NonFiniteLossError",
    "StaticAdapter",
    "TorchvisionAdapter",
    "TorchvisionCollate",
    "TrainConfig",
    "TrainResult",
    "TrainSetupError",
    "TrainState",
    "Trainer",
    "WarmupMultiStep",
    "build_model",
    "build_optimizer",
    "build_scheduler",
    "checkpoint_path",
    "ensure_synthetic",
    "evaluate",
    "evaluate_torchvision",
    "latest_checkpoint",
    "load_checkpoint",
    "make_adapter",
    "train",
    "zero_residual_init",
]
