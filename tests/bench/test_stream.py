"""The default workload of ``mrcnn-bench run``: a stream of varied sizes by a stated rule of the seed,
one synthetic image each (varied object counts), warmed up image by image; ``--sizes`` and its errors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from mrcnn.config import get_config
from mrcnn.transform import resized_size, select_canvas
from mrcnn_bench.cli import commands as cli
from mrcnn_bench.cli import options as cli_options
from mrcnn_bench.running import runner
from mrcnn_bench.running.cases import (
    CASES,
    STREAM_ASPECTS,
    STREAM_IMAGES,
    STREAM_LONG_SIDE,
    Row,
    Workload,
    stream_sizes,
    stream_workload,
)
from mrcnn_bench.running.context import Context, stream_images


def aspect(size: tuple[int, int]) -> tuple[int, int]:
    """The entry of STREAM_ASPECTS (width:height) that ``size`` (height, width) was drawn with."""
    h, w = size
    return min(STREAM_ASPECTS, key=lambda a: abs(math.log(w / h) - math.log(a[0] / a[1])))


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_the_stream_follows_its_rule_and_lands_on_several_canvases(seed):
    sizes = stream_sizes(seed)
    assert len(sizes) == STREAM_IMAGES == len(STREAM_ASPECTS)
    assert sorted(map(aspect, sizes)) == sorted(STREAM_ASPECTS)  # each aspect ratio once
    for (h, w), (aw, ah) in zip(sizes, map(aspect, sizes), strict=True):
        long_side, short_side = max(h, w), min(h, w)
        assert STREAM_LONG_SIDE[0] <= long_side <= STREAM_LONG_SIDE[1]
        assert short_side == round(long_side * min(aw, ah) / max(aw, ah))
        assert (w >= h) == (aw >= ah)  # landscape stays landscape, portrait portrait
    assert any(h > w for h, w in sizes) and any(w > h for h, w in sizes)
    assert stream_sizes(seed) == sizes and stream_sizes(seed + 100) != sizes  # the seed's, and only the seed's
    assert stream_sizes(seed, 3) == sizes[:3]
    for preset in ("tiny", "coco_r50_fpn"):
        cfg = get_config(preset)
        canvases = {select_canvas([resized_size(h, w, cfg)], cfg) for h, w in sizes}
        assert len(canvases) >= 2, (preset, canvases)


def test_the_default_stream_of_seed_0():
    # Pinned: the rule draws only random.Random(seed).random(), whose sequence Python keeps across versions.
    assert stream_sizes(0) == ((472, 472), (406, 507), (611, 407), (271, 482), (273, 410), (562, 422), (518, 291),
                               (300, 400))
    assert len(stream_sizes(0, 20)) == 20  # longer streams take every aspect ratio again


def test_workload_label_and_json_say_which_kind():
    fixed = Workload("tiny", (240, 320), 1, 3)
    assert fixed.sizes_label == "fixed 240x320" and fixed.kind == "fixed 240x320"
    assert list(fixed.to_dict()) == ["preset", "image_size", "batch_size", "images"]  # the keys run files have
    stream = stream_workload("tiny", seed=0)
    assert stream.images == STREAM_IMAGES and stream.image_size == (240, 320)  # training steps at the fixed size
    assert stream.sizes_label.startswith("stream of 8 sizes (472x472, 406x507, ") and stream.kind == "stream of 8 sizes"
    assert Workload.from_dict(stream.to_dict()) == stream
    assert Workload.from_dict(json.loads(json.dumps(stream.to_dict()))) == stream  # lists in a file
    assert Workload(sizes=((10, 20),), images=5).images == 1  # a stream's images are its sizes
    with pytest.raises(ValueError, match="sizes"):
        Workload(sizes=((0, 20),))


def test_stream_images_are_synthetic_images_with_varied_object_counts():
    sizes = stream_sizes(0)
    images = stream_images(sizes, seed=0)
    assert [tuple(im.shape[-2:]) for im, _ in images] == list(sizes)
    assert all(im.dtype == torch.float32 and float(im.min()) >= 0.0 and float(im.max()) <= 1.0 for im, _ in images)
    counts = [n for _, n in images]
    assert counts[1] == 0 and counts[6] >= 20 and len(set(counts)) >= 4  # the generator's schedule: empty, crowded
    again = stream_images(sizes[:2], seed=0)
    assert torch.equal(again[0][0], images[0][0])  # deterministic, and image i does not depend on the count


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_warm_up_goes_over_every_image_of_the_stream(batch):
    workload = stream_workload("tiny", seed=0, batch_size=batch)
    opts = runner.RunOptions(workload, rows=[], warmup=1)
    images = [torch.full((1,), float(i)) for i in range(workload.images)]
    ctx = Context("tiny", {}, workload, {}, images, [], 1, 0)
    calls = runner.warmup_calls(Row(CASES["static/eager"]), opts, images=len(images))
    warmed = {float(x) for i in range(calls) for x in ctx.call_images(i)}
    assert warmed == {float(i) for i in range(workload.images)}  # every distinct image before round 1
    later = {float(x) for i in range(calls, calls + 40) for x in ctx.call_images(i)}
    assert later <= warmed
    # Training: the same samples every step, and two steps (the second has the optimiser's state).
    assert runner.warmup_calls(Row(CASES["static/train"]), opts, images=len(images)) == runner.TRAIN_WARMUP


def test_run_defaults_to_the_stream_and_keeps_a_fixed_size_on_request():
    parse = cli.build_parser().parse_args
    assert cli_options.run_workload(parse(["run"])) == stream_workload("tiny", seed=0)
    assert cli_options.run_workload(parse(["run", "--seed", "3", "--images", "2"])).sizes == stream_sizes(3, 2)
    assert cli_options.run_workload(parse(["run", "--image-size", "480x640"])) == Workload("tiny", (480, 640), 1, 3)
    assert cli_options.run_workload(parse(["run", "--sizes", "480x640, 640x480"])).sizes == ((480, 640), (640, 480))
    assert not cli_options.run_workload(parse(["compare", "a.json", "b.json"])).sizes  # compare keeps its fixed size
    assert not cli_options.run_workload(parse(["run", "--coco-root", "x"])).sizes  # COCO's own images, at their sizes


@pytest.mark.parametrize(("argv", "message"), [
    (["--sizes", "480x640,abc"], "argument --sizes: image size 'abc' is not HxW"),
    (["--sizes", "480x640,"], "is not a comma list of HxW"),
    (["--sizes", ""], "is not a comma list of HxW"),
    (["--sizes", "0x640"], "must be positive"),
    (["--sizes", "480x640x3"], "is not HxW"),
    (["--sizes", "480x640", "--image-size", "240x320"], "give --sizes (a stream) or --image-size"),
    (["--sizes", "480x640,640x480", "--images", "3"], "a stream has one image per size"),
    (["--sizes", "480x640", "--coco-root", "."], "--coco-root times its own images"),
])
def test_malformed_sizes_are_usage_errors(argv, message, capsys):
    assert cli.main(["run", "--cases", "static/eager", "--rounds", "0", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1
