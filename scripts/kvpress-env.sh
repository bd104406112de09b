#!/usr/bin/env bash
# A venv with the kvpress extra beside the main environment: kvpress 0.5.5 pins transformers<5.3, which the main
# environment need not have. The venv sees every package of the main one (dynheads included, editable) and adds
# kvpress with transformers 5.2.x in front of them. Safe to re-run; prints the venv's python.
#   bash scripts/kvpress-env.sh            -> .venv-kvpress/bin/python
#   $(bash scripts/kvpress-env.sh) -m dynheads kv --policies full,kvpress:streaming_llm ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
VENV="${KVPRESS_VENV:-.venv-kvpress}"
# transformers.activations imports the hub-kernels integration, which fails with a `kernels` newer than transformers
# 5.2 declares (<0.11): the main environment's transformers 5.x may bring one (0.19.1 on a fresh machine, 2026-12-04).
if ! "$VENV/bin/python" -c "import kvpress, dynheads, transformers.activations" 2>/dev/null; then
  "$PY" -m venv --system-site-packages "$VENV" >&2
  # The main environment may itself be a venv (not the "system" one): add its site-packages too, with its .pth
  # files (the editable dynheads), behind the venv's own.
  PARENT=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "import site; site.addsitedir('$PARENT')" > "$SITE/_dynheads_main_env.pth"
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q --root-user-action=ignore \
    "kvpress==0.5.5" "transformers>=5.2,<5.3" "kernels>=0.10.2,<0.11" >&2
fi
echo "$VENV/bin/python"
