"""Benchmark harness for the static Mask R-CNN: cases -> runner -> store -> report -> gate.

asv (``bench/asv_suite``) and pytest-benchmark (``bench/test_*.py``) are thin front ends over
:mod:`mrcnn_bench.cases`; ``mrcnn-bench`` is the command line.
"""
