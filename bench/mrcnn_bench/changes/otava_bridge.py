"""Apache Otava's change-point detection over plain series: run by Otava's own interpreter.

    .venv-otava/bin/python bench/mrcnn_bench/changes/otava_bridge.py < request.json > answer.json

``apache-otava`` pins numpy and scipy to versions the harness's environment does not have, and
brings cloud clients it does not need, so it lives in an environment of its own (``make
otava-env``) and this file is the whole of the harness that runs there: standard library only at
import, so it runs as a plain script without the harness installed. :mod:`mrcnn_bench.changes.changepoints`
starts it and reads its answer.

Request (stdin, JSON): ``{"series": {"metric": [float, ...], ...}, "window": int, "max_pvalue":
float, "min_magnitude": float}``. Answer (stdout, JSON): ``{"metric": [[index, p_value], ...]}``,
the change points Otava keeps after its merge step, ``index`` the first point of the new level.
"""

from __future__ import annotations

import json
import sys


def main() -> int:
    # Imported here: the harness imports this module's name without Otava (tests, the module list).
    from otava.analysis import compute_change_points

    request = json.load(sys.stdin)
    answer = {}
    for metric, values in request["series"].items():
        # A list, not an array: Otava's detector slices a window only out of non-array input.
        points, _weak = compute_change_points(
            [float(v) for v in values],
            window_len=int(request["window"]),
            max_pvalue=float(request["max_pvalue"]),
            min_magnitude=float(request["min_magnitude"]),
        )
        answer[metric] = [[int(p.index), float(p.stats.pvalue)] for p in points]
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
