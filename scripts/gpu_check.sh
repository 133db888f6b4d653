#!/usr/bin/env bash
# GPU check: on a CUDA machine, run the GPU tests, the benchmark (serial, zos and the
# speculative variants), record timelines (JSON + HTML) and torch.profiler (Kineto) traces of
# the CUDA engine in serial and ZOS (torch_profile_{serial,zos}.json.gz, read by notebook 06;
# copy them into overlap_course/traces/cuda/ to ship them) into one folder.
#   bash scripts/gpu_check.sh [OUT_DIR]      (default: artifacts/gpu)
# Fits in a few minutes on one GPU.  Needs the package installed (./run.sh test does it).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-artifacts/gpu}
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
"$PY" - <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit("no CUDA GPU visible to torch: this script only makes sense on a GPU machine")
print("GPU:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PY
nvidia-smi -L | tee "$OUT/gpu.txt" || true
"$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_device.py tests/test_zos.py \
    --override-ini addopts= 2>&1 | tee "$OUT/gpu_tests.txt"
"$PY" -m overlap_course.measure.bench --device cuda --json > "$OUT/bench_cuda.json"
"$PY" -m overlap_course.measure.bench --device cuda --host-overhead-ms 2 --json > "$OUT/bench_cuda_overhead2.json"
"$PY" -c "import json,sys; from overlap_course.measure.bench import format_table; print(format_table(json.load(open('$OUT/bench_cuda.json'))))" | tee "$OUT/bench_cuda.txt"
"$PY" scripts/record_traces.py --device cuda --out "$OUT"
"$PY" scripts/profile_cuda.py --device cuda --out "$OUT" | tee "$OUT/torch_profile_summary.txt"
"$PY" - "$OUT" <<'PY'
import sys
from pathlib import Path
from overlap_course import figures
from toy_engine.timeline import Timeline
out = Path(sys.argv[1])
runs = {p.stem: Timeline.from_json(p) for p in sorted(out.glob("cuda_*.json"))}
for name, tl in runs.items():
    figures.save_html(figures.timeline_figure(tl), out / f"{name}.html")
if runs:
    figures.save_html(figures.compare_figure(runs), out / "cuda_compare.html")
print("wrote", sorted(p.name for p in out.iterdir()))
PY
