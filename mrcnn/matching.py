"""Static matcher and balanced sampler: torchvision's semantics with shapes fixed by the config.

torchvision's ``Matcher`` and ``BalancedPositiveNegativeSampler`` work on the real boxes of each
image and return index lists whose length depends on the data. Here ground truth is padded to G
slots with a ``valid`` mask, and every output has a fixed shape:

- :func:`match` returns one match per candidate ([B, N]); padded ground truth can never be matched.
- :func:`sample_balanced` returns exactly K = min(batch_size_per_image, N) slots per image, with
  torchvision's counts: ``num_pos = min(#pos, int(batch_size_per_image * positive_fraction))`` and
  ``num_neg = min(#neg, batch_size_per_image - num_pos)``. Slots beyond those counts are marked
  invalid. Random keys plus top-k choose uniformly at random, as torchvision's ``randperm`` does.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

BELOW_LOW_THRESHOLD = -1  # torchvision Matcher.BELOW_LOW_THRESHOLD: a negative
BETWEEN_THRESHOLDS = -2  # torchvision Matcher.BETWEEN_THRESHOLDS: ignored


def match(
    quality: Tensor,
    gt_valid: Tensor,
    high_threshold: float,
    low_threshold: float,
    allow_low_quality_matches: bool = False,
) -> Tensor:
    """torchvision's ``Matcher`` on padded ground truth.

    Args:
        quality: [B, G, N] match quality (IoU) of every (ground truth, candidate) pair.
        gt_valid: [B, G] bool; padded slots never match and never create low-quality matches.
        high_threshold, low_threshold, allow_low_quality_matches: as ``Matcher(high, low, allow)``.

    Returns:
        [B, N] int64: the matched ground-truth slot in [0, G), or ``BELOW_LOW_THRESHOLD`` (-1),
        or ``BETWEEN_THRESHOLDS`` (-2). An image without valid ground truth gets -1 everywhere
        (all background), which is what torchvision does for an image without boxes.
    """
    if low_threshold > high_threshold:
        raise ValueError(f"low_threshold {low_threshold} must be <= high_threshold {high_threshold}")
    # IoU lies in [0, 1]: -1 ranks padded slots below every real one and below any threshold.
    quality = torch.where(gt_valid[:, :, None], quality, -1.0)
    matched_vals, all_matches = quality.max(dim=1)  # first maximum on ties, as torchvision
    matches = torch.where(
        matched_vals < low_threshold,
        BELOW_LOW_THRESHOLD,
        torch.where(matched_vals < high_threshold, BETWEEN_THRESHOLDS, all_matches),
    )
    if allow_low_quality_matches:
        # Every candidate tied for the best quality of some ground truth gets its best match back,
        # however low (torchvision's set_low_quality_matches_).
        highest = quality.max(dim=2, keepdim=True).values  # [B, G, 1]
        is_best = ((quality == highest) & gt_valid[:, :, None]).any(dim=1)  # [B, N]
        matches = torch.where(is_best, all_matches, matches)
    return matches


class Samples(NamedTuple):
    """K sampled candidates per image, sampled positives first.

    index:    [B, K] int64 into the N candidates (padded slots point at some candidate)
    positive: [B, K] bool, sampled positives; they fill the first ``num_pos`` slots of each image
    valid:    [B, K] bool, sampled positives and negatives (False on padded slots)
    """

    index: Tensor
    positive: Tensor
    valid: Tensor


def sample_balanced(labels: Tensor, batch_size_per_image: int, positive_fraction: float) -> Samples:
    """torchvision's ``BalancedPositiveNegativeSampler`` with a fixed output size.

    Args:
        labels: [B, N] int; > 0 positive, 0 negative, < 0 ignored (never sampled).
        batch_size_per_image, positive_fraction: as torchvision's sampler.

    Returns:
        :class:`Samples` with K = min(batch_size_per_image, N) slots per image, positives first,
        then negatives, then padding. The first ``int(batch_size_per_image * positive_fraction)``
        slots are therefore the sampled positives plus padding: the mask branch takes those.
    """
    n = labels.shape[1]
    k = min(batch_size_per_image, n)
    quota = min(int(batch_size_per_image * positive_fraction), n)
    noise = torch.rand(labels.shape, device=labels.device)  # [0, 1): a uniformly random order
    positive = labels > 0
    if quota > 0:
        # The `quota` positives with the largest keys, or all of them when there are fewer.
        top = torch.where(positive, noise, -1.0).topk(quota, dim=1)
        chosen = torch.zeros_like(positive).scatter(1, top.indices, top.values >= 0)
    else:
        chosen = torch.zeros_like(positive)
    # Chosen positives rank above every negative, negatives above the rest: one top-k then takes
    # num_pos positives and min(#neg, K - num_pos) negatives, torchvision's counts.
    key = torch.where(chosen, noise + 3.0, torch.where(labels == 0, noise + 1.0, 0.0))
    top = key.topk(k, dim=1)
    return Samples(top.indices, top.values > 2.5, top.values > 0.5)
