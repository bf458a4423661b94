"""Fixed-shape detection ops: NMS and multi-level RoIAlign, each as pure tensors or torchvision."""

from ._library import resolve_impl
from .nms import nms_fixed, nms_fixed_segments
from .roi_align import multilevel_roi_align

__all__ = ["multilevel_roi_align", "nms_fixed", "nms_fixed_segments", "resolve_impl"]
