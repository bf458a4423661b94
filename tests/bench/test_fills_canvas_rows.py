"""The compiled static rows tell the model, at each call, whether the batch fills its canvas, read
on the host; a checkout whose model has no such argument is called as it always was."""

from __future__ import annotations

from torch import nn

from mrcnn.transform import to_image_batch
from mrcnn.weights import textured_images
from mrcnn_bench.running.pipelines import _telling_fills_canvas


class _Recording(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.cfg, self.told = cfg, []

    def forward(self, batch, targets=None, fills_canvas=False):
        self.told.append(fills_canvas)


class _Older(nn.Module):
    def forward(self, batch, targets=None):
        raise AssertionError("not called here")


def test_each_call_is_told_what_the_host_found(tiny_cfg):
    model = _Recording(tiny_cfg).eval()
    forward = _telling_fills_canvas(model, model)
    fills, short = (to_image_batch(textured_images((size,)), tiny_cfg) for size in [(240, 320), (250, 300)])
    forward(fills)
    forward(short)
    mixed = to_image_batch(textured_images(((240, 320), (250, 300))), tiny_cfg)
    forward(mixed, "targets")
    model.train()
    forward(mixed, "targets")
    assert model.told == [True, False, False, True]


def test_a_model_without_the_argument_keeps_its_forward():
    older = _Older()
    assert _telling_fills_canvas(older, older.forward) == older.forward
