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

# mrcnn-bench compare (live) and the gate's latency check: K pairs of fresh processes, the pair the
# unit of the test. Pairs and rounds are the cheapest that find a 3% slowdown 80% of the time and 5%
# 95% of the time, against the 1% threshold at alpha 0.01, under each measured noise model:
# results/compare_pairs/design.md (bench/studies/compare_pairs/design.py).
COMPARE_CASES = "static/eager"
COMPARE_PAIRS = 18  # process pairs, A and B alternating which starts first
COMPARE_ROUNDS = 32  # interleaved rounds timed by each pair (even: each side runs first in half)
PAIR_THRESHOLD = 0.01  # relative slowdown that counts, tested across pairs
MIN_PAIRS = 3  # fewer process pairs than this leave no spread across pairs to test against
# The noise the pairs were sized on, the larger of the two measured models for each (static/eager,
# tiny, 2 threads): the sd of a pair's mean log(B/A) between pairs beyond its rounds' noise (72 one-pair
# A/A compares), and of one round's log(B/A) within a process (48 pairs on AMD EPYC f25m17).
PROCESS_SD = 0.0139
ROUND_SD = 0.1179
# mrcnn-bench latency-check, sized to fit CI's five minutes: fewer pairs and rounds than compare's,
# with a power of 1.00 for a 10% slowdown and 0.90 for 5% under the noise model above
# (gates.stats.pair_power); the check prints its power, and results/latency_check/ its trials.
CHECK_PAIRS = 10
CHECK_ROUNDS = 24
CHECK_OUT = "out/latency-check"
THRESHOLD = 0.05  # relative slowdown that counts for one process per side (--pairs 1) and stored runs
ALPHA = 0.01  # family-wise error rate over the cases of one comparison (Holm)
PAIR_TEST = "one-sided t-test across process pairs of each pair's mean log ratio B/A against 1 + threshold"
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
