#!/usr/bin/env bash
# What one commit's measurement for the history costs: the harness of REF (an older way of measuring)
# and this checkout's, one after the other on this host, each on its own checkout's model.
#
#   bash bench/studies/commit_cost/commit_cost.sh REF OUT_DIR
#
# Writes OUT_DIR/REF8.log (REF's harness) and OUT_DIR/checkout.log (this checkout's): the progress
# lines of every part, the parts' records, and the wall time from /usr/bin/time. A log that exists
# is kept, so the study resumes. Run it on an otherwise idle machine, never beside a measurement.
set -euo pipefail
ref=${1:?usage: commit_cost.sh REF OUT_DIR}
out=${2:?usage: commit_cost.sh REF OUT_DIR}
root=$(git rev-parse --show-toplevel)
py=${PY:-$root/.venv/bin/python}
fixture=${MRCNN_ASV_FIXTURE:-$root/.asv/fixtures}
[ -f "$fixture/model.pt" ] || { echo "commit_cost: no accuracy fixture in $fixture: run make asv-fixture" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the measurements run in their own checkouts
export PJRT_DEVICE=CPU MRCNN_ASV_FIXTURE=$fixture

measure() {  # $1: checkout to measure (its mrcnn and its harness), $2: log
    local tree=$1 log=$2
    [ -s "$log" ] && { echo "kept $log"; return; }
    {
        echo "# $(date -u +%FT%TZ), $(git -C "$tree" rev-parse --short HEAD), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)," \
             "family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs) model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
        (cd "$tree" && PYTHONPATH="$tree:$tree/bench" /usr/bin/time -f "%e s total" "$py" -c '
import json
from mrcnn_bench.history.commit import measure_commit
r = measure_commit().to_dict()
print(json.dumps({k: {c: p["seconds"] for c, p in v.items()} for k, v in r.items() if k != "accuracy"}))
print("accuracy", r["accuracy"]["seconds"], r["accuracy"]["record"])
' 2>&1)
    } > "$log.part" && mv "$log.part" "$log"
    tail -1 "$log"
}

tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/ref" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add --detach "$tmp/ref" "$ref" >/dev/null
measure "$tmp/ref" "$out/$(git -C "$root" rev-parse --short=8 "$ref").log"
measure "$root" "$out/checkout.log"
