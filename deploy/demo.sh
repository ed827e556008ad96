#!/usr/bin/env bash
# A working llmgw on this machine, no GPU, no root, no network: SQLite, this machine as a
# node over a local transport, and the built-in simulated engine. Stop it with Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv || { echo "python3 -m venv failed: install python3-venv (Debian/Ubuntu) first" >&2; exit 1; }
fi
.venv/bin/python -m pip install -q -e .
exec .venv/bin/flask --app llmgw:create_app llmgw demo --root "${LLMGW_DEMO_ROOT:-$PWD/demo-root}" "$@"
