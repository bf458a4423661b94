"""Defaults that a command's behaviour and its ``--help`` both read, so the two cannot disagree.

Standard library only: ``mrcnn-bench --help`` imports this module, never the modules that measure
(they load torch). ``tests/test_cli.py`` checks that every help text shows these values
(``test_every_flag_has_help_that_states_its_default``, ``test_help_defaults_are_the_commands_constants``).
"""

from __future__ import annotations

# mrcnn-bench run
RUN_ROUNDS = 10  # interleaved timed rounds
RUN_WARMUP = 1  # untimed calls per row before round 1 (at least one per distinct input: runner.warmup_calls)
RUN_IMAGES = 3  # distinct generated images, cycled over the rounds
REPORT_OUT = "out/report"  # generated output: under out/, which git ignores (tests/bench/test_default_outputs.py)

# mrcnn-bench compare (live) and the gate's latency check
COMPARE_CASES = "static/eager"
COMPARE_ROUNDS = 25  # the fewest meeting the error-rate goals: results/latency_gate_live/error_rates.md
THRESHOLD = 0.05  # relative slowdown that counts as a regression
ALPHA = 0.01  # family-wise error rate over the cases of one comparison (Holm)
TEST = "one-sided Wilcoxon signed-rank test of the per-round ratios B/A against 1 + threshold"
# compare RUN_A.json RUN_B.json: the sd of log(B/A) between two separate runs of the same code beyond
# what their rounds' spread explains (static/eager over torchvision/eager, tiny, 2 threads, this host):
# results/stored_compare_aa/summary.md.
BETWEEN_RUN_SD = 0.0374

# mrcnn-bench gate and accuracy-gate
# Inputs the gates read, relative to the repository root (results/ holds measurements, not inputs):
# the compile counts gate_<preset>.json, and accuracy/<recipe>.json. --write-baseline writes here.
BASELINES_DIR = "baselines"
# The compile-count cases of a new baseline: inference under inductor and on XLA, the mask branch's
# detection buckets, and training with mask-RoI buckets (steps of varying ground truth).
GATE_CASES = ("static/inductor", "static/xla", "static/inductor+buckets", "static/inductor-train+buckets")
INJECTIONS = ("recompile",)  # faults the compile gate can inject to show that it fails
