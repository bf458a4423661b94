"""Fixtures shared by the library's test modules (the helpers they share are in ``tests/helpers``)."""

from __future__ import annotations

import pytest

from tests.helpers.training import parity_batch, parity_config


@pytest.fixture(scope="module")
def parity_setup(tiny_cfg):
    """The loss-parity batch: (config whose samplers take every candidate, two images [3, h, w],
    their torchvision-style targets), so the training losses of both models are deterministic."""
    cfg = parity_config(tiny_cfg)
    images, per_image = parity_batch(cfg)
    return cfg, images, per_image
