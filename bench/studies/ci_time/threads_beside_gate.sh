#!/usr/bin/env bash
# Does the unit tests' torch thread count change how long they take beside the gate's one-thread
# training, as `make test` runs them? Arms alternate (2, 1, 2, 1 threads by default), each on an
# empty inductor cache, while `mrcnn-bench gate --skip-compile` trains in a loop beside them.
# Usage: bench/studies/ci_time/threads_beside_gate.sh OUT_DIR [ARMS] -- TEST_PATHS...
# Writes OUT_DIR/threads_beside_gate.txt (one line per arm) and the arms' and the load's logs.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:?usage: threads_beside_gate.sh OUT_DIR [ARMS] -- TEST_PATHS...}
shift
arms="2 1 2 1"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then arms=$1; shift; fi
[ "${1:-}" = "--" ] || { echo "threads_beside_gate.sh: '--' and the test paths expected" >&2; exit 2; }
shift
[ $# -gt 0 ] || { echo "threads_beside_gate.sh: no test paths after '--'" >&2; exit 2; }
mkdir -p "$out"
stop="$out/stop"
rm -f "$stop"
( while [ ! -f "$stop" ]; do
    CI=true .venv/bin/mrcnn-bench gate --skip-compile --no-progress --accuracy-out "$out/load_gate" >> "$out/load.log" 2>&1 || true
  done ) &
load=$!
trap 'touch "$stop"; pkill -P $load 2>/dev/null || true' EXIT
sleep 60  # the load past its start-up, into its training steps
i=0
for arm in $arms; do
  i=$((i + 1))
  log="$out/arm${i}_threads$arm.log"  # one log per arm: a thread count that repeats keeps both
  rm -rf "$out/inductor"
  start=$(date +%s.%N)
  rc=0
  TORCHINDUCTOR_CACHE_DIR="$out/inductor" CI=true MRCNN_TEST_THREADS=$arm \
    .venv/bin/python -m pytest -q -p no:cacheprovider "$@" > "$log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  echo "threads=$arm rc=$rc wall_s=$(echo "$end - $start" | bc) $(tail -1 "$log")" >> "$out/threads_beside_gate.txt"
done
