#!/usr/bin/env bash
# Does inductor's compile-thread count change how long the gate's static/inductor probe takes from an
# empty cache? Arms alternate (default, one, default, one: TORCHINDUCTOR_COMPILE_THREADS=1).
# Usage: bench/studies/ci_time/compile_threads_probe.sh OUT_DIR
# Writes OUT_DIR/compile_threads_probe.txt (one line per arm) and each arm's probe JSON and log.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:?usage: compile_threads_probe.sh OUT_DIR}
mkdir -p "$out"
export PJRT_DEVICE=CPU
i=0
for arm in default one default one; do
  i=$((i + 1))
  rm -rf "$out/inductor"
  threads=(); [ "$arm" = one ] && threads=(TORCHINDUCTOR_COMPILE_THREADS=1)
  start=$(date +%s.%N)
  rc=0
  env TORCHINDUCTOR_CACHE_DIR="$out/inductor" "${threads[@]}" .venv/bin/python -m mrcnn_bench.gates.compile_probe \
    static/inductor tiny "$out/arm${i}_$arm.json" > "$out/arm${i}_$arm.log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  echo "$arm $(echo "$end - $start" | bc) rc=$rc" >> "$out/compile_threads_probe.txt"
done
