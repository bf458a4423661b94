#!/bin/bash
# The gate's static/inductor compile probe from an empty inductor cache, alternating inductor's default
# compile threads with TORCHINDUCTOR_COMPILE_THREADS=1; seconds per run to /tmp/probe_ab.txt. Run on an idle machine.
cd "$(dirname "$0")/../../.."
export PJRT_DEVICE=CPU
for arm in default one default one; do
  rm -rf /tmp/pab_cache; mkdir -p /tmp/pab_cache
  extra=""; [ $arm = one ] && extra="TORCHINDUCTOR_COMPILE_THREADS=1"
  s=$(date +%s.%N)
  env TORCHINDUCTOR_CACHE_DIR=/tmp/pab_cache $extra .venv/bin/python -m mrcnn_bench.gates.compile_probe static/inductor tiny /tmp/pab_$arm.json > /tmp/pab_$arm.log 2>&1
  rc=$?
  e=$(date +%s.%N)
  echo "$arm $(echo "$e - $s" | bc) rc=$rc" >> /tmp/probe_ab.txt
done
