#!/usr/bin/env bash
# The GPU checks behind BENCHMARKS.md's GPU section, as one call on a machine with CUDA and no network:
#   1. the oracle tests on the GPU: the probe's rows and reductions, its head removals, the write score and batched
#      tracing against transformers' eager attention (or batch 1), every model family of tests/zoo.py, fp32 on CUDA
#      (DYNHEADS_TEST_DEVICE=cuda puts the tiny models there; the packaged-model tests are left out: no download);
#   2. benchmarks/bench_gpu.py: plain `generate` against `trace` (B = 1) and `trace_batch` (B = 4) on the
#      random-weight Llama-3.1-8B shape, 8k-64k keys, bf16.
# It runs from a checkout with PYTHONPATH=src (nothing installed) and writes its logs and raw rows to OUT_DIR.
#
#   bash benchmarks/gpu_checks.sh OUT_DIR [TIMED_ROUNDS]     # about 5 min on an H200
set -uo pipefail
out=${1:?usage: bash benchmarks/gpu_checks.sh OUT_DIR [TIMED_ROUNDS]}
rounds=${2:-3}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/device.txt"

DYNHEADS_TEST_DEVICE=cuda python3 -m pytest -p no:cacheprovider -m "not embedded" -k "not packaged" \
  tests/test_probe_exactness.py tests/test_write_score.py tests/test_batching.py 2>&1 | tee "$out/oracle-tests.log"
tests=${PIPESTATUS[0]}

python3 benchmarks/bench_gpu.py --lengths 8192,16384,32768,65536 --new-tokens 32 --batch-sizes 1,4 --write-score \
  --rounds "$rounds" --out "$out/gpu.json" 2>&1 | tee "$out/bench.log"
bench=${PIPESTATUS[0]}

echo "oracle tests rc=$tests, bench rc=$bench"
exit $((tests || bench))
