"""Data: the synthetic COCO-format set (synthetic), the COCO loader (coco), static batches (collate)."""
