#!/usr/bin/env bash
# Is one way of measuring a commit noisier than another, on one VM on the same day? Both ways
# measure the same model (REF's mrcnn) in alternating A/A runs, so the VM's noise of the day is
# the same for both and a difference is the way's.
#
#   bash bench/studies/commit_cost/same_vm_aa.sh REF RUNS PER_CASE_OUT SHARED_OUT
#   bash bench/studies/commit_cost/same_vm_aa.sh --plans REF RUNS PLAN_0_OUT PLAN_1_OUT
#
# Run k of the per-case way is REF's own harness (`bench/tools/history_spread.py --runs k`, in a
# worktree of REF, which predates `mrcnn-bench asv spread`); run k of the shared rounds is this
# checkout's harness (`python -m mrcnn_bench asv spread --runs k`) on REF's mrcnn, as asv measures a
# commit. With --plans both sides are this checkout's shared rounds and differ only in the process
# that times inductor (`--compiled-from 0`: the one that ran its compile probe, the suite's plan;
# `--compiled-from 1`: the next one), and the side that goes first swaps from pair to pair, so that
# a drift of the VM over the study falls on both alike. Each A/A study keeps the runs it has, so the
# script resumes where it stopped; a STOP file in the second OUT ends it between runs. The start and
# end of every run go to the second OUT's alternation.log (the per-case way's records hold no wall
# time of their own). Run it on an idle machine only.
set -euo pipefail
usage="usage: same_vm_aa.sh [--plans] REF RUNS FIRST_OUT SECOND_OUT"
plans=0
[ "${1:-}" = --plans ] && { plans=1; shift; }
ref=${1:?$usage}
runs=${2:?$usage}
first=${3:?$usage}
second=${4:?$usage}
root=$(git rev-parse --show-toplevel)
py=${PY:-$root/.venv/bin/python}
fixture=${MRCNN_ASV_FIXTURE:-$root/.asv/fixtures}
mkdir -p "$first" "$second"
first=$(cd "$first" && pwd) second=$(cd "$second" && pwd)  # absolute: the runs start elsewhere
export PJRT_DEVICE=CPU MRCNN_ASV_FIXTURE=$fixture
log=$second/alternation.log
# Without the fixture neither way scores the fixed checkpoint's AP (about 11 s of a commit, the
# same for both): the timing is what this study compares, so it goes on and says so in the log.
[ -f "$fixture/model.pt" ] || echo "# no accuracy fixture in $fixture: neither way measures AP" >> "$log"

tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/ref" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git -C "$root" worktree add --detach "$tmp/ref" "$ref" >/dev/null
tree=$tmp/ref
echo "# $(date -u +%FT%TZ) REF $(git -C "$tree" rev-parse --short=8 HEAD), harness $(git -C "$root" rev-parse --short=8 HEAD)," \
     "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)" \
     "model $(grep -m1 '^model\s' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores" >> "$log"

one() {  # $1: way, $2: run number, $3: output folder, $4: PYTHONPATH, $5: REF's history_spread.py to run, or
         # "this" for this checkout's `mrcnn-bench asv spread`, $6...: its options
    [ -f "$3/run_$2.json" ] && return
    echo "$(date -u +%FT%TZ) start $1 run $2" >> "$log"
    # A fresh inductor cache per run: the per-case harness shares the user's, which would make its
    # later runs' compile probes warm where the shared rounds' (a cache per commit) are cold.
    local runner=("$5")
    [ "$5" = this ] && runner=(-m mrcnn_bench asv spread)
    (cd "$tree" && TORCHINDUCTOR_CACHE_DIR=$tmp/inductor-$1-$2 PYTHONPATH=$4 "$py" "${runner[@]}" --runs "$2" --out "$3" "${@:6}" \
        > "$tmp/run.out" 2>&1) || { tail -20 "$tmp/run.out" >&2; exit 1; }
    echo "$(date -u +%FT%TZ) end $1 run $2" >> "$log"
}

stop() {  # $1: what is not started
    [ -e "$second/STOP" ] && { echo "$(date -u +%FT%TZ) stopped before $1" >> "$log"; exit 0; }
    return 0
}

here=("$root/bench:$tree" this)
outs=("$first" "$second")  # with --plans, plan P's runs go to outs[P]
for k in $(seq 1 "$runs"); do
    if [ "$plans" = 1 ]; then
        sides=(0 1)
        [ $((k % 2)) = 0 ] && sides=(1 0)
        for p in "${sides[@]}"; do
            stop "plan $p run $k"
            one "plan-$p" "$k" "${outs[$p]}" "${here[@]}" --compiled-from "$p"
        done
    else
        stop "run $k"
        one per-case "$k" "$first" "$tree:$tree/bench" "$tree/bench/tools/history_spread.py"
        stop "shared run $k"
        one shared "$k" "$second" "${here[@]}"
    fi
done
