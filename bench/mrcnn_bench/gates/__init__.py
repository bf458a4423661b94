"""Verdicts: the latency rule and its statistics, compare A B, compile counts, the accuracy gate and its
faults, the speed goals, and the merge gate over them.

May import: ``base``, ``running``.
"""
