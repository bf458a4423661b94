"""Benchmark harness for the static Mask R-CNN: cases -> runner -> records -> store -> report -> gate.

A house of rooms, one subpackage per concern; each room's ``__init__`` says what it is for and which
rooms it may import (``tests/test_architecture.py`` holds every import to that, and no module lives
outside a room). From the bottom up:

    ``base``      the defaults commands print, the one clock (the standard library only)
    ``publish``   asv's published pages made to load with no network, and their screenshots
    ``running``   cases, pipelines, rows in this process or a worker, probes, records, journal, run files
    ``gates``     the latency rule and its statistics, compare A B, compile counts, accuracy, goals, the gate
    ``reports``   tables, plots and the dashboard of run files; PyTorch benchmark database records
    ``history``   the history across commits: the ruler, one commit measured, the fixed checkpoint's AP
    ``changes``   series from asv's results, change points, ``mrcnn-bench steps``, the regression report
    ``cli``       ``mrcnn-bench``: the only room that reads argv (``python -m mrcnn_bench`` is the same)

The module map, written from the tree: docs/harness.md. The logic of finished studies lives beside
each study in ``bench/studies/``, outside the installed package. asv (``bench/asv_suite``, over
:mod:`mrcnn_bench.history.commit`) and pytest-benchmark (``bench/pytest_suite``) are thin front ends
over :mod:`mrcnn_bench.running.cases` and :mod:`mrcnn_bench.running.pipelines`.
"""
