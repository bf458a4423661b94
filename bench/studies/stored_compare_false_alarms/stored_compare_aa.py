"""The false-alarm rate of ``mrcnn-bench compare RUN_A.json RUN_B.json`` across separate runs.

    python bench/studies/stored_compare_false_alarms/stored_compare_aa.py run [--pairs 72] [--rounds 25]
        [--out results/stored_compare_aa]
    python bench/studies/stored_compare_false_alarms/stored_compare_aa.py summary [--out results/stored_compare_aa]

A trial is two separate ``mrcnn-bench run`` processes of the same code and settings (torchvision/eager
and static/eager, the tiny preset, three 240x320 images, ``--rounds`` rounds, each row in its own
worker as ``run`` does by default), one after the other, then the stored-run comparison of the
second against the first as ``compare A.json B.json`` makes it (:func:`mrcnn_bench.gates.ab.compare_records`
with ``relative=True``: each round's static/eager time over the same round's torchvision/eager time,
judged by the rule ``compare`` has for stored runs). Nothing differs between A and B, so every
"regression" is a false alarm. The run files go to ``out/stored_compare_aa/`` (not committed);
each finished trial is appended to ``OUT/trials.jsonl`` with the per-round times and the verdict, so
an interrupted study resumes at the next trial.

``summary`` writes ``OUT/summary.md``: the false-alarm rate of the per-round rule (rounds of the two
runs paired by index, what stored comparisons used before) with its two-sided 95% Clopper-Pearson
interval and the number of trials; the spread of the stored ratio B/A between runs; the between-run
sd that :func:`mrcnn_bench.gates.stats.compare_stored` allows for (``defaults.BETWEEN_RUN_SD``); and that
rule's false alarms and detections of B's times scaled by 1.1 to 1.3, each half of the trials
judged with the sd fitted on the other half.
"""


from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/: the studies' shared modules (studies.*)

from studies.stored_compare_false_alarms.stored_false_alarms import run, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("run", "summary"))
    parser.add_argument("--pairs", type=int, default=72, help="trials (72: what a claimed rate <= 5%% needs)")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--out", type=Path, default=Path("results/stored_compare_aa"))
    args = parser.parse_args()
    return run(args.out, args.pairs, args.rounds) if args.what == "run" else summary(args.out)


if __name__ == "__main__":
    sys.exit(main())
