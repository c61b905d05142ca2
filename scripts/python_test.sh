#!/usr/bin/env bash
# The Python package's part of `make test`: a virtual environment of its own (build/venv), the pinned wheels of
# python/requirements.txt from a local cache (downloaded from PyPI once; a second run downloads nothing), then
# `pip install .` (the extension over the same CMake target) and pytest over tests/python.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/venv
wheels=${FLASHTQ_WHEEL_CACHE:-$HOME/.cache/flashtq/wheels}
requirements=python/requirements.txt
# The tests run on the CPU; on this project's 2-core machines the CUDA kernels would add many minutes of compiling
# for code that cannot run here. `pip install .` alone builds every backend it finds; set
# FLASHTQ_PYTHON_CMAKE_DEFINE="" on a GPU machine to do the same here (the CUDA tests then run). The SIMD kernels
# are compiled for AVX2 and the scalar fall-back only, as in the checking builds: each Highway target is another
# copy of every kernel to compile, and the release tests already run every target the machine has.
defines=${FLASHTQ_PYTHON_CMAKE_DEFINE-FLASHTQ_CUDA=OFF;FLASHTQ_WEBGPU=OFF;FLASHTQ_HWY_DISABLED_TARGETS=HWY_SSSE3|HWY_SSE4|HWY_AVX3}

[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
mkdir -p "$wheels"
if ! "$venv/bin/pip" download -q --no-deps --no-index --find-links "$wheels" -d "$wheels" -r "$requirements" >/dev/null 2>&1; then
  echo "python: fetching the pinned wheels into $wheels (once)"
  "$venv/bin/pip" download -q --no-deps -d "$wheels" -r "$requirements"
fi
"$venv/bin/pip" install -q --no-deps --no-index --find-links "$wheels" -r "$requirements"

echo "python: pip install . (${defines:-every backend found})"
SKBUILD_CMAKE_DEFINE="$defines" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  "$venv/bin/pip" install -q --no-build-isolation --no-deps --no-index --force-reinstall .

echo "python: pytest tests/python"
HF_HUB_OFFLINE=1 "$venv/bin/python" -m pytest -q tests/python "$@"
