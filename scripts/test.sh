#!/usr/bin/env bash
# Install (idempotent) and run the whole test suite. `.ci/run` calls exactly this.
# --fast: the fast lane for local work, every test but those that read the embedded model's GGUF, its weights or its
# tokenizer (pytest -m "not embedded", the one marker, set in tests/conftest.py) and without the kvpress venv's run;
# CI never passes it.
set -euo pipefail
case "${1:-}" in
  "") FAST=0 ;;
  --fast) FAST=1 ;;
  *) echo "usage: bash scripts/test.sh [--fast]" >&2 && exit 2 ;;
esac
cd "$(dirname "$0")/.."
bash scripts/install.sh
# The HTML report is tested in a real headless browser: Debian's Chromium (Playwright drives it; no browser
# download). Installed when missing and we may (root with apt-get).
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
# Lint, format and types first (seconds, so they fail fast): ruff (pinned in the dev extra: its formatting moves
# between minor releases) and mypy over src/dynheads, both configured in pyproject.toml.
"${PYTHON:-python3}" -m ruff check src tests benchmarks
"${PYTHON:-python3}" -m ruff format --check src tests benchmarks
"${PYTHON:-python3}" -m mypy
if [ "$FAST" = 1 ]; then
  exec "${PYTHON:-python3}" -m pytest -q -m "not embedded"
fi
"${PYTHON:-python3}" -m pytest -q
# kvpress pins transformers<5.3: its tests (skipped above when the main environment lacks it) run again in a venv
# with the extra (about 30 s to build, once).
KVPRESS_PY=$(bash scripts/kvpress-env.sh)
exec "$KVPRESS_PY" -m pytest -q tests/test_kvpress.py tests/test_kvpress_wrappers.py
