#!/usr/bin/env bash
# The KV-retention grid of docs/results/2026-11-kv-memory-smollm2.md on the embedded model, end to end, resumable:
#   bash scripts/kv-grid.sh OUT [--device cuda]
# 1. fit (own seed streams): a static list on 'static' (10 samples, 500 and 1000 tokens) and a probe on 'kvprobe'
#    (20 samples); 2. evaluate on 'analysis': 1000, 2000 and 4000 tokens x 5 depths x 6 runs = 30 samples per length,
#    every policy at budgets 5 %, 10 %, 25 % of the KV heads, on the same samples; with kvpress importable (the
#    [kvpress] extra, e.g. PYTHON=$(bash scripts/kvpress-env.sh)) also kvpress:streaming_llm, snapkv,
#    expected_attention and duo_attention (the static list). Every stage resumes where it stopped, so a command
#    killed by a time limit is simply run again; the tables are in OUT/grid/summary.md when it prints "done".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:?usage: bash scripts/kv-grid.sh OUT [--device cuda]}"
shift
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
dh() { "$PY" -m dynheads "$@"; }
mkdir -p "$OUT"
[ -f "$OUT/static/static_heads.json" ] || dh static --out "$OUT/static" --samples 10 --lengths 500,1000 "$@"
cat > "$OUT/kv-probe-train.toml" <<'TOML'
split = "kvprobe"
lengths = [500, 1000]
depths = [0.0, 0.25, 0.5, 0.75, 1.0]
runs = 2
TOML
dh niah --out "$OUT/probe-train" --config "$OUT/kv-probe-train.toml" "$@"
[ -f "$OUT/probe-train/probe/metrics.json" ] \
  || dh predictor train "$OUT/probe-train" --hidden-sizes 512,256 --epochs 100 --early-stopping 10 --seed 0
POLICIES=full,none,static,probe,random,oracle,true
if "$PY" -c "import kvpress" 2>/dev/null; then
  POLICIES="$POLICIES,kvpress:streaming_llm,kvpress:snapkv,kvpress:expected_attention,kvpress:duo_attention"
fi
dh kv --out "$OUT/grid" --static "$OUT/static/static_heads.json" --probe "$OUT/probe-train/probe" \
  --policies "$POLICIES" --budgets 0.05,0.1,0.25 --lengths 1000,2000,4000 --depths 0,0.25,0.5,0.75,1 --runs 6 "$@"
echo "done: $OUT/grid/summary.md"
