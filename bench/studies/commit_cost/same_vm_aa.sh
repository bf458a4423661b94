#!/usr/bin/env bash
# Is the shared rounds' noise worse than the per-case way's, on one VM on the same day? Both ways
# measure the same model (REF's mrcnn) in alternating A/A runs, so the VM's noise of the day is
# the same for both and a difference is the way's.
#
#   bash bench/studies/commit_cost/same_vm_aa.sh REF RUNS PER_CASE_OUT SHARED_OUT
#
# Run k of the per-case way is REF's own harness (`history_spread.py --runs k`, in a worktree of
# REF); run k of the shared rounds is this checkout's harness on REF's mrcnn, as asv measures a
# commit. Each A/A study keeps the runs it has, so the script resumes where it stopped; a STOP file
# in SHARED_OUT ends it between runs. The start and end of every run go to SHARED_OUT/alternation.log
# (the per-case way's records hold no wall time of their own). Run it on an idle machine only.
set -euo pipefail
ref=${1:?usage: same_vm_aa.sh REF RUNS PER_CASE_OUT SHARED_OUT}
runs=${2:?usage: same_vm_aa.sh REF RUNS PER_CASE_OUT SHARED_OUT}
per_case=${3:?usage: same_vm_aa.sh REF RUNS PER_CASE_OUT SHARED_OUT}
shared=${4:?usage: same_vm_aa.sh REF RUNS PER_CASE_OUT SHARED_OUT}
root=$(git rev-parse --show-toplevel)
py=${PY:-$root/.venv/bin/python}
fixture=${MRCNN_ASV_FIXTURE:-$root/.asv/fixtures}
mkdir -p "$per_case" "$shared"
per_case=$(cd "$per_case" && pwd) shared=$(cd "$shared" && pwd)  # absolute: the runs start elsewhere
export PJRT_DEVICE=CPU MRCNN_ASV_FIXTURE=$fixture
log=$shared/alternation.log
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

one() {  # $1: way, $2: run number, $3: output folder, $4: PYTHONPATH, $5: history_spread.py to run
    [ -f "$3/run_$2.json" ] && return
    echo "$(date -u +%FT%TZ) start $1 run $2" >> "$log"
    # A fresh inductor cache per run: the per-case harness shares the user's, which would make its
    # later runs' compile probes warm where the shared rounds' (a cache per commit) are cold.
    (cd "$tree" && TORCHINDUCTOR_CACHE_DIR=$tmp/inductor-$1-$2 PYTHONPATH=$4 "$py" "$5" --runs "$2" --out "$3" \
        > "$tmp/run.out" 2>&1) || { tail -20 "$tmp/run.out" >&2; exit 1; }
    echo "$(date -u +%FT%TZ) end $1 run $2" >> "$log"
}

for k in $(seq 1 "$runs"); do
    [ -e "$shared/STOP" ] && { echo "$(date -u +%FT%TZ) stopped before run $k" >> "$log"; exit 0; }
    one per-case "$k" "$per_case" "$tree:$tree/bench" "$tree/bench/tools/history_spread.py"
    [ -e "$shared/STOP" ] && { echo "$(date -u +%FT%TZ) stopped before shared run $k" >> "$log"; exit 0; }
    one shared "$k" "$shared" "$root/bench:$tree" "$root/bench/tools/history_spread.py"
done
