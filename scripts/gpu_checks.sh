#!/usr/bin/env bash
# The checks a change to the GPU path needs, on a machine with a CUDA GPU, in an environment where this package and
# fastai import (the repository on PYTHONPATH is enough): the device-event path's calls and a batch of marks, the cost
# benchmark before and after (BASE: a checkout of the version before, e.g. `git worktree add /tmp/base HEAD~1`), the GPU
# tests, and the observe-only tests with every feature on. Each part's output is kept in $OUT (default gpu_checks/).
#   bash scripts/gpu_checks.sh /tmp/base
set -u
BASE="${1:?usage: bash scripts/gpu_checks.sh BASE_CHECKOUT}"
OUT="${OUT:-gpu_checks}"; mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::DeprecationWarning,ignore::FutureWarning}"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== the event path's calls ($(date +%T))"
timeout 60 python3 benchmarks/gpu_marks.py --base "$BASE" 2>&1 | tee "$OUT/marks.txt"
echo "== the cost of each configuration, before and after ($(date +%T))"
timeout 300 python3 benchmarks/gpu_overhead.py --rounds 5 --base "$BASE" \
  --configs base:events base:events+mem events events+mem events+mem+idle events+mem+hw 2>&1 | tee "$OUT/bench.txt"
echo "== the GPU tests ($(date +%T))"
timeout 200 python3 -m pytest -q -s -p no:cacheprovider -m gpu tests/test_sync.py tests/test_gpu_accuracy.py \
  tests/test_gpu_flops.py tests/test_gpu_memory.py tests/test_gpu_idle.py tests/test_hardware.py 2>&1 | tee "$OUT/gpu_tests.txt" | tail -60
echo "== observe-only with every feature on ($(date +%T))"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 6 tests/test_observe_only.py tests/test_export.py -k "all or export" 2>&1 \
  | tee "$OUT/observe.txt" | tail -15
echo "== done ($(date +%T))"
