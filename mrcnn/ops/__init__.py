"""Fixed-shape detection ops: NMS and multi-level RoIAlign, each as pure tensors or torchvision."""

from ._library import resolve_impl
from .nms import nms_fixed
from .roi_align import multilevel_roi_align

__all__ = ["multilevel_roi_align", "nms_fixed", "resolve_impl"]
