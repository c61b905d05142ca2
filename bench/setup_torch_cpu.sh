#!/usr/bin/env bash
# The CPU benchmark's optional set-up: PyTorch (pinned) in its own virtual environment under build/,
# for bench/cpu.sh's side-by-side comparison. `make test` never runs this: the wheel is large.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/torch-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -c 'import torch' 2>/dev/null || "$venv/bin/pip" install -q torch==2.5.1 numpy==2.1.3
