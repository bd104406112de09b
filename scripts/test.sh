#!/usr/bin/env bash
# Install (idempotent) and run the whole test suite. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
exec "${PYTHON:-python3}" -m pytest -q
