"""``--resume`` only continues the run a checkpoint came from: a file that is not a checkpoint, one of
another config or implementation, or not a torch file at all is refused before anything is loaded,
naming the file (the CLI's exit 2), instead of a KeyError or a silent change of run."""

from __future__ import annotations

import pytest
import torch

from mrcnn.config import get_config
from mrcnn.data.synthetic import generate
from mrcnn.engine import TrainConfig, checkpoint_path, train
from mrcnn.train import main

SMALL = dict(min_size=128, max_size=160, canvases=((128, 160), (160, 128), (128, 128)), rpn_pre_nms_top_n_train=200,
             rpn_post_nms_top_n_train=100, rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=50,
             box_batch_size_per_image=32, box_pre_nms_top_n=100, gt_mask_size=16)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """Data and a 2-step run with its checkpoint."""
    root = tmp_path_factory.mktemp("resume")
    generate(root / "data", 4, seed=0, split="train", progress=False)
    torch.set_num_threads(1)
    train(get_config("tiny", **SMALL), root / "data", root / "run",
          TrainConfig(batch_size=2, steps=2, val_split=None, checkpoint_every=2), progress=False)
    return root


def _resume(run_dir, *extra):
    sets = [a for k, v in SMALL.items() for a in ("--set", f"{k}={v!r}".replace(" ", ""))]
    return main(["--preset", "tiny", *sets, "--data", str(run_dir / "data"), "--out", str(run_dir / "again"),
                 "--steps", "3", "--batch-size", "2", "--val-split", "", "--device", "cpu", "--no-progress", *extra])


def test_another_config_or_impl_is_refused(run_dir, capsys):
    ckpt = str(checkpoint_path(run_dir / "run", 2))
    assert _resume(run_dir, "--resume", ckpt, "--set", "gt_mask_size=28") == 2
    assert "another config (gt_mask_size 16 there, 28 here)" in capsys.readouterr().err
    assert _resume(run_dir, "--resume", ckpt, "--impl", "torchvision") == 2
    assert "trained with --impl static, not torchvision" in capsys.readouterr().err


def test_a_state_dict_or_junk_is_refused_naming_the_file(run_dir, capsys):
    weights = run_dir / "weights.pt"
    torch.save({"backbone.x": torch.zeros(2)}, weights)
    junk = run_dir / "junk.pt"
    junk.write_bytes(b"junk\n")
    assert _resume(run_dir, "--resume", str(weights)) == 2
    assert f"{weights} is not a checkpoint of mrcnn train" in capsys.readouterr().err
    for flag in ("--resume", "--weights"):
        assert _resume(run_dir, flag, str(junk)) == 2
        err = capsys.readouterr().err
        assert f"{junk}: not a" in err and "torch.save wrote" in err and "Traceback" not in err
