"""The training engine (mrcnn.engine) and its CLI (mrcnn.train): schedule, exact resume, NaN stop, AMP,
evaluation, CLI, and DDP.

Everything runs on tiny synthetic data at 128-160 px with small static sizes, a few steps each,
at one thread (so runs are bitwise reproducible).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mrcnn.config import get_config
from mrcnn.data.collate import BucketBatchSampler
from mrcnn.data.synthetic import generate
from mrcnn.engine import (
    LOSS_NAMES,
    NonFiniteLossError,
    TrainConfig,
    WarmupMultiStep,
    build_optimizer,
    build_scheduler,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    train,
)
from mrcnn.model import MaskRCNN
from mrcnn.train import main

SMALL = dict(
    min_size=128,
    max_size=160,
    canvases=((128, 160), (160, 128), (128, 128)),
    rpn_pre_nms_top_n_train=200,
    rpn_post_nms_top_n_train=100,
    rpn_pre_nms_top_n_test=100,
    rpn_post_nms_top_n_test=50,
    box_batch_size_per_image=32,
    box_pre_nms_top_n=100,
    gt_mask_size=16,
)
CLI_SET = [arg for key, value in SMALL.items() for arg in ("--set", f"{key}={value!r}".replace(" ", ""))]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cfg():
    return get_config("tiny", **SMALL)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic")
    generate(root, 6, seed=0, split="train", progress=False)
    generate(root, 2, seed=1, split="val", progress=False)
    return root


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def run(cfg, data, out, *, resume=None, weights=None, **settings):
    """train() with small defaults; ``settings`` are TrainConfig fields."""
    options = TrainConfig(**{"batch_size": 2, "lr": 0.01, "warmup_iters": 2, "val_split": None, **settings})
    return train(cfg, data, out, options, resume=resume, weights=weights, progress=False)


# ------------------------------------------------------------------------------------------------
# Schedule


def test_schedule_is_warmup_then_multistep_per_iteration():
    """The LambdaLR factor equals torch's LinearLR warm-up chained with MultiStepLR, both per iteration."""
    lr, warmup, factor, milestones, gamma = 0.02, 5, 0.001, [8, 12], 0.1
    ours = build_scheduler(build_optimizer(torch.nn.Linear(2, 2), lr, 0.9, 1e-4), warmup, factor, milestones, gamma)
    ref_opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=lr)
    ref = torch.optim.lr_scheduler.ChainedScheduler(
        [
            torch.optim.lr_scheduler.LinearLR(ref_opt, start_factor=factor, total_iters=warmup),
            torch.optim.lr_scheduler.MultiStepLR(ref_opt, milestones=milestones, gamma=gamma),
        ]
    )
    seen = []
    for _ in range(16):
        seen.append(ours.get_last_lr()[0])
        assert seen[-1] == pytest.approx(ref.get_last_lr()[0], rel=1e-9)
        ours.optimizer.step()
        ref_opt.step()
        ours.step()
        ref.step()
    assert seen[0] == pytest.approx(lr * factor) and seen[5] == pytest.approx(lr)
    assert seen[8] == pytest.approx(lr * gamma) and seen[12] == pytest.approx(lr * gamma**2)
    with pytest.raises(ValueError, match="increasing"):
        WarmupMultiStep(1, 0.1, [5, 3])


# ------------------------------------------------------------------------------------------------
# Checkpoints and resume


def test_resume_continues_exactly(cfg, data, tmp_path):
    """5 steps straight == 2 steps, then resume from the checkpoint for 3 more (losses and weights bitwise)."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    run(cfg, data, straight, steps=5, checkpoint_every=2)
    assert sorted(p.name for p in straight.glob("checkpoint_*.pt")) == [
        "checkpoint_0000002.pt",
        "checkpoint_0000004.pt",
        "checkpoint_0000005.pt",
    ]
    run(cfg, data, split, steps=2)
    first_half = load_checkpoint(checkpoint_path(split, 2))
    assert first_half["step"] == 2 and set(first_half) >= {"model", "optimizer", "scheduler", "rng", "epoch"}
    result = run(cfg, data, split, steps=5, resume=split)  # a folder: its latest checkpoint
    assert result.step == 5

    a, b = records(straight), records(split)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4, 5]
    assert max(r["epoch"] for r in a) >= 1, "the run should cross an epoch boundary"
    for ra, rb in zip(a, b):
        assert [ra[n] for n in LOSS_NAMES] == [rb[n] for n in LOSS_NAMES], ra["step"]
        assert ra["lr"] == rb["lr"] and ra["gt_instances"] == rb["gt_instances"]
    assert len({r["loss"] for r in a}) == 5, "losses should change from step to step"
    end_a, end_b = load_checkpoint(checkpoint_path(straight, 5)), load_checkpoint(checkpoint_path(split, 5))
    assert end_a.keys() == end_b.keys()
    for key, value in end_a["model"].items():
        assert torch.equal(value, end_b["model"][key]), key
    start = load_checkpoint(checkpoint_path(straight, 2))["model"]
    assert any(not torch.equal(start[k], v) for k, v in end_a["model"].items()), "training should move the weights"
    assert end_a["optimizer"]["state"].keys() == end_b["optimizer"]["state"].keys()
    for key, state in end_a["optimizer"]["state"].items():
        assert torch.equal(state["momentum_buffer"], end_b["optimizer"]["state"][key]["momentum_buffer"])
    assert end_a["scheduler"]["last_epoch"] == end_b["scheduler"]["last_epoch"] == 5

    run(cfg, data, straight, steps=2)  # a fresh run (no resume) into a used folder starts a fresh curve
    assert [r["step"] for r in records(straight)] == [1, 2]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(cfg, data, tmp_path, monkeypatch):
    class NanAtFourthStep(MaskRCNN):
        calls = 0

        def forward(self, batch, targets=None):
            out = super().forward(batch, targets)
            if self.training:
                NanAtFourthStep.calls += 1
                if NanAtFourthStep.calls == 4:
                    out["loss_mask"] = out["loss_mask"] * float("nan")
            return out

    monkeypatch.setattr("mrcnn.engine.launch.build_model", lambda cfg, weights=None, *_, **__: NanAtFourthStep(cfg))
    with pytest.raises(
        NonFiniteLossError, match=r"non-finite loss at step 4 \(.*loss_mask=nan.*checkpoint_0000002\.pt kept"
    ):
        run(cfg, data, tmp_path, steps=6, checkpoint_every=2)
    # Step 4 was a checkpoint step: nothing was written for it, and step 2's checkpoint is intact.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_0000002.pt", "metrics.jsonl"]
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 2)
    good = load_checkpoint(tmp_path / "checkpoint_0000002.pt")
    assert good["step"] == 2 and all(torch.isfinite(v).all() for v in good["model"].values())
    assert [r["step"] for r in records(tmp_path)] == [1, 2, 3]


def test_epochs_cover_every_image_once(cfg, data, tmp_path):
    """epochs=1 runs one pass: as many steps as batches, every annotated instance seen once."""
    from mrcnn.data.coco import CocoDataset

    dataset = CocoDataset.from_config(data, "train", cfg)
    batches = len(BucketBatchSampler(dataset.sizes, cfg, 2))
    result = run(cfg, data, tmp_path, epochs=1)
    rows = records(tmp_path)
    assert result.step == len(rows) == batches
    assert {r["epoch"] for r in rows} == {0}
    assert sum(r["gt_instances"][0] for r in rows) == len(dataset.coco.getAnnIds(iscrowd=False))
    with pytest.raises(ValueError, match="exactly one of steps and epochs"):
        run(cfg, data, tmp_path, steps=1, epochs=1)


def test_weights_start_the_model(cfg, data, tmp_path):
    """``weights`` (a torchvision-format state_dict) replaces the random init; lr 0 leaves it as loaded."""
    torch.manual_seed(123)
    start = MaskRCNN(cfg).state_dict()
    torch.save(start, tmp_path / "start.pt")
    run(cfg, data, tmp_path / "out", steps=1, lr=0.0, weights=tmp_path / "start.pt")
    end = load_checkpoint(checkpoint_path(tmp_path / "out", 1))["model"]
    assert all(torch.equal(v, end[k]) for k, v in start.items())


# ------------------------------------------------------------------------------------------------
# Mixed precision


def test_bf16_training_on_cpu(cfg, data, tmp_path):
    result = run(cfg, data, tmp_path, steps=2, amp="bf16")
    assert result.step == 2 and all(torch.isfinite(torch.tensor(v)) for v in result.losses.values())
    weights = load_checkpoint(checkpoint_path(tmp_path, 2))["model"]
    assert all(v.dtype != torch.bfloat16 for v in weights.values()), "master weights stay fp32"


def test_fp16_needs_cuda(cfg, data, tmp_path):
    with pytest.raises(ValueError, match=r"fp16.*CUDA"):
        run(cfg, data, tmp_path, steps=1, amp="fp16", device="cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 + GradScaler needs a CUDA GPU; none is visible")
def test_fp16_gradscaler_training_on_cuda(cfg, data, tmp_path):
    result = run(cfg, data, tmp_path, steps=3, amp="fp16", device="cuda", checkpoint_every=3)
    ckpt = load_checkpoint(checkpoint_path(tmp_path, 3))
    assert result.step == 3 and ckpt["scaler"] is not None and ckpt["scaler"]["scale"] > 0
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


# ------------------------------------------------------------------------------------------------
# Evaluation and command line


def test_cli_generates_data_trains_and_evaluates(tmp_path, capsys):
    data, out = tmp_path / "data", tmp_path / "out"
    argv = ["--preset", "tiny", *CLI_SET, "--data", str(data), "--synth-count", "4", "--out", str(out)]
    argv += ["--steps", "2", "--eval-every", "1", "--no-final-eval", "--warmup-iters", "2", "--quiet"]
    assert main(argv) == 0
    assert (data / "annotations" / "instances_train.json").is_file()
    assert (data / "annotations" / "instances_val.json").is_file()
    rows = records(out)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert {"loss", "lr", "time", "step_time", "data_time", *LOSS_NAMES} <= row.keys()
        for key in ("bbox/AP", "segm/AP", "bbox/AP50", "segm/AP50"):
            assert 0.0 <= row[key] <= 1.0, (key, row[key])
    assert rows[0]["lr"] == pytest.approx(0.02 * 0.001)  # the first step runs at the warm-up start
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["step"] == 2 and "segm/AP" in summary


# ------------------------------------------------------------------------------------------------
# Distributed


def test_ddp_rank_without_ground_truth_neither_crashes_nor_hangs(cfg, data, tmp_path):
    """torchrun, 2 CPU processes (gloo): every image rank 1 sees has no annotation."""
    from mrcnn.data.coco import CocoDataset

    dataset = CocoDataset.from_config(data, "train", cfg)
    sampler = BucketBatchSampler(dataset.sizes, cfg, 1, shuffle=True, seed=0, num_replicas=2, rank=1)
    rank1_ids = {dataset.ids[i] for batch in sampler for i in batch}
    raw = json.loads((data / "annotations" / "instances_train.json").read_text())
    raw["annotations"] = [a for a in raw["annotations"] if a["image_id"] not in rank1_ids]
    root = tmp_path / "data"
    (root / "annotations").mkdir(parents=True)
    (root / "annotations" / "instances_ddp.json").write_text(json.dumps(raw))
    (root / "ddp").symlink_to(data / "train", target_is_directory=True)
    steps = len(sampler)  # one epoch, so the shuffle is the one computed above

    def torchrun(out: Path, *extra: str) -> None:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        command += ["-m", "mrcnn.train", "--preset", "tiny", *CLI_SET, "--data", str(root), "--train-split", "ddp"]
        command += ["--val-split", "", "--out", str(out), "--steps", str(steps), "--batch-size", "1"]
        command += ["--device", "cpu", "--threads", "1", "--warmup-iters", "1", "--quiet", *extra]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        # A session of its own, so a hang kills torchrun's workers too, not only torchrun.
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        try:
            _, stderr = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            _, stderr = proc.communicate()
            pytest.fail(f"DDP run hung (killed after 150 s): {stderr[-4000:]}")
        assert proc.returncode == 0, stderr[-4000:]

    out = tmp_path / "out"
    torchrun(out, "--checkpoint-every", "1")
    rows = records(out)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert all(r["gt_instances"][1] == 0 for r in rows), "rank 1 must only see images without objects"
    assert sum(r["gt_instances"][0] for r in rows) > 0
    assert all(r["loss_mask"] >= 0 and r["loss"] > 0 for r in rows)
    ckpt = load_checkpoint(checkpoint_path(out, steps))
    assert ckpt["world_size"] == 2 and len(ckpt["rng"]) == 2
    assert not torch.equal(ckpt["rng"][0]["torch"], ckpt["rng"][1]["torch"]), "ranks draw their own sampling noise"
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())

    # Resuming the DDP run from its first checkpoint ends on the same weights (every rank's RNG restored).
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(checkpoint_path(out, 1), checkpoint_path(resumed, 1))
    torchrun(resumed, "--resume", str(resumed))
    assert [r["loss"] for r in records(resumed)] == [r["loss"] for r in rows[1:]]
    end = load_checkpoint(checkpoint_path(resumed, steps))["model"]
    assert all(torch.equal(v, end[k]) for k, v in ckpt["model"].items())


# ------------------------------------------------------------------------------------------------
# torchvision path and recipes


def test_torchvision_impl_starts_from_the_static_weights_trains_and_evaluates(cfg, data, tmp_path):
    from mrcnn.engine import build_model

    torch.manual_seed(3)
    static = build_model(cfg).state_dict()
    torch.manual_seed(3)
    reference = build_model(cfg, impl="torchvision")
    assert type(reference).__module__.startswith("torchvision")
    assert all(torch.equal(v, static[k]) for k, v in reference.state_dict().items())

    out = tmp_path / "tv"
    result = run(cfg, data, out, steps=2, impl="torchvision", val_split="val")
    rows = records(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["gt_instances"][0] >= 0 and r["loss"] > 0 and r["cpu_time"] > 0 for r in rows)
    assert 0.0 <= rows[-1]["bbox/AP"] <= 1.0 and 0.0 <= rows[-1]["segm/AP"] <= 1.0
    assert load_checkpoint(result.checkpoint)["impl"] == "torchvision"
    # The same batches: both implementations see the same ground-truth count at every step.
    static_out = tmp_path / "static"
    run(cfg, data, static_out, steps=2, val_split=None)
    assert [r["gt_instances"] for r in records(static_out)] == [r["gt_instances"] for r in rows]
    with pytest.raises(ValueError, match="impl"):
        run(cfg, data, tmp_path / "bad", steps=1, impl="detectron")


def test_recipe_sets_the_run_and_explicit_flags_override_it(tmp_path, monkeypatch):
    import argparse

    from mrcnn.recipes import get_recipe
    from mrcnn.train import UsageError, add_arguments, resolve_arguments

    monkeypatch.chdir(tmp_path)  # the relative data folder "d" below
    parser = add_arguments(argparse.ArgumentParser())
    recipe = get_recipe("ci")
    job = resolve_arguments(parser.parse_args(["--recipe", "ci", "--out", str(tmp_path), "--data", "d"]))
    cfg, opts, want = job.cfg, job.options, recipe.train
    assert cfg == recipe.config() and job.data_root == recipe.data_root("d")
    assert (opts.steps, opts.batch_size, opts.lr) == (want.steps, want.batch_size, want.lr)
    assert opts.lr_steps == want.lr_steps and opts.warmup_iters == want.warmup_iters
    assert (opts.optimizer, opts.val_split) == (want.optimizer, want.val_split)
    assert not (Path("d") / "synth-48-0-s0").exists(), "resolving flags must not generate data"

    argv = ["--recipe", "ci", "--out", str(tmp_path), "--lr", "0.5", "--steps", "7", "--set", "min_size=192"]
    job = resolve_arguments(parser.parse_args(argv))
    assert (job.options.steps, job.options.lr, job.cfg.min_size) == (7, 0.5, 192)
    assert job.options.batch_size == want.batch_size and job.cfg.max_size == recipe.config().max_size
    job = resolve_arguments(parser.parse_args([*argv, "--val-split", "", "--optimizer", "sgd"]))
    assert (job.options.val_split, job.options.optimizer) == (None, "sgd")
    job = resolve_arguments(parser.parse_args(["--recipe", "ci", "--out", str(tmp_path), "--epochs", "2"]))
    assert (job.options.steps, job.options.epochs) == (None, 2)

    monkeypatch.setenv("WORLD_SIZE", "2")
    job = resolve_arguments(parser.parse_args(["--recipe", "ci", "--out", str(tmp_path)]))
    assert job.options.batch_size == want.batch_size // 2  # the recipe's batch is global

    with pytest.raises(UsageError, match="--steps"):
        resolve_arguments(parser.parse_args(["--out", str(tmp_path), "--data", "d"]))


def test_cli_reports_bad_flags_and_bad_input_in_one_line(tmp_path, capsys):
    """Exit 2 with one line naming the problem (argparse's usage line before it for usage errors), no traceback."""
    assert main(["--out", str(tmp_path / "x")]) == 2
    assert "--steps" in capsys.readouterr().err

    assert main(["--recipe", "nosuch", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown recipe 'nosuch'" in err[0]

    argv = ["--out", str(tmp_path / "x"), "--steps", "1", "--quiet", "--device", "cpu"]
    assert main([*argv, "--data", str(tmp_path / "absent")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "absent" in err[0] and "not found" in err[0]

    bad = tmp_path / "bad"
    (bad / "annotations").mkdir(parents=True)
    (bad / "annotations" / "instances_train.json").write_text('{"images": [}')
    assert main([*argv, "--data", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "instances_train.json" in err[0] and "malformed JSON" in err[0]


def test_adamw_and_gradient_clipping(cfg, data, tmp_path):
    from mrcnn.engine import OPTIMIZERS

    assert isinstance(build_optimizer(torch.nn.Linear(2, 2), 1e-3, 0.9, 1e-4, "adamw"), torch.optim.AdamW)
    with pytest.raises(ValueError, match="optimizer"):
        build_optimizer(torch.nn.Linear(2, 2), 1e-3, 0.9, 1e-4, "lamb")
    assert OPTIMIZERS == ("sgd", "adamw")
    clipped = run(cfg, data, tmp_path / "clip", steps=2, optimizer="adamw", clip_grad_norm=1e-3, lr=1.0)
    free = run(cfg, data, tmp_path / "free", steps=2, optimizer="adamw", clip_grad_norm=0.0, lr=1.0)
    assert all(math.isfinite(v) for v in clipped.losses.values())
    # The first moment holds the gradients AdamW was given: clipped ones differ.
    a, b = (load_checkpoint(r.checkpoint)["optimizer"]["state"] for r in (clipped, free))
    assert not torch.allclose(a[0]["exp_avg"], b[0]["exp_avg"]), "clipping must change the gradients seen"
    with pytest.raises(ValueError, match="optimizer"):
        run(cfg, data, tmp_path / "bad", steps=1, optimizer="lamb")


def test_zero_residual_init_zeroes_the_last_conv_of_each_trainable_block(cfg):
    from torchvision.models.resnet import BasicBlock

    from mrcnn.engine import build_model

    torch.manual_seed(0)
    model = build_model(cfg, init="zero_residual")
    blocks = [m for m in model.backbone.modules() if isinstance(m, BasicBlock)]
    assert len(blocks) == 8  # ResNet-18, every stage trainable in the tiny preset
    assert all(b.conv2.weight.abs().sum() == 0 and b.conv1.weight.abs().sum() > 0 for b in blocks)
    torch.manual_seed(0)
    default = build_model(cfg)
    assert all(b.conv2.weight.abs().sum() > 0 for b in default.backbone.modules() if isinstance(b, BasicBlock))
    with pytest.raises(ValueError, match="init"):
        build_model(cfg, init="orthogonal")
