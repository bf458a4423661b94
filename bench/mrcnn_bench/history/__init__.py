"""The history across commits: the fixed ruler, one case timed against it, a commit measured (asv's suite is a
thin front end over :mod:`mrcnn_bench.history.commit`), the fixed checkpoint's AP, asv's machine name, the
A/A spread, and the scratch ranges with their injected regressions.

May import: ``base``, ``running``, ``gates``.
"""
