#!/usr/bin/env bash
# Bench step for the C++ example: export a package, build the example, run it, record the results.
#
#   cpp/run_example.sh                         # tiny preset, 240x320 sample image
#   PRESET=coco_r50_fpn SAMPLE=480x640 cpp/run_example.sh
#
# Writes results/export/{export,export_time,cpp_build,cpp_output}_<preset>.* (logs, export.json, the timing report,
# the output of the program).
# Packages and the sample image go to out/export/<preset>/ (not committed: about 50 MB for tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PRESET=${PRESET:-tiny}
SAMPLE=${SAMPLE:-240x320}
ROUNDS=${ROUNDS:-10}
REPEAT=${REPEAT:-11}
OUT=${OUT:-out/export/$PRESET}
RESULTS=${RESULTS:-results/export}
mkdir -p "$RESULTS" "$OUT"
# A cold inductor cache, so the AOTInductor compile time is that of a first build.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d -t mrcnn-inductor-XXXXXX)}

echo "== $(date -u +%FT%TZ) $(uname -n), $(nproc) cores, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
{ time "$PY" -m mrcnn.export --preset "$PRESET" --out "$OUT" --sample-image "$SAMPLE" --check; } \
  2>&1 | grep -v -e "UserWarning" -e "torch.frombuffer" | tee "$RESULTS/export_$PRESET.log"
cp "$OUT/export.json" "$RESULTS/export_$PRESET.json"
PACKAGE=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['paths']['aoti'])" "$OUT/export.json")
PACKAGES=$("$PY" -c "import json, sys; print(' '.join(json.load(open(sys.argv[1]))['paths'].values()))" "$OUT/export.json")

# Outputs against eager, time to first result and interleaved latency (mrcnn-bench export-time).
# shellcheck disable=SC2086  # PACKAGES is a list of paths
{ time "$PY" -m mrcnn_bench.running.export_timing $PACKAGES --image "$OUT/sample.ppm" --rounds "$ROUNDS" \
    --out "$OUT/export_time.json"; } \
  2>&1 | grep -v -e "UserWarning" -e "torch.frombuffer" | tee -a "$RESULTS/export_$PRESET.log"
cp "$OUT/export_time.json" "$RESULTS/export_time_$PRESET.json"

{
  echo "== load average before the build: $(cut -d' ' -f1-3 /proc/loadavg)"
  time cmake -S cpp -B cpp/build -DCMAKE_BUILD_TYPE=Release -DPYTHON_EXECUTABLE="$PY"
  time cmake --build cpp/build
} 2>&1 | tee "$RESULTS/cpp_build_$PRESET.log"

{
  echo "\$ cpp/build/mrcnn_aoti_example $PACKAGE $OUT/sample.ppm --repeat $REPEAT"
  echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  env -u PYTHONPATH cpp/build/mrcnn_aoti_example "$PACKAGE" "$OUT/sample.ppm" --repeat "$REPEAT"
} 2>&1 | tee "$RESULTS/cpp_output_$PRESET.txt"
