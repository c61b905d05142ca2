#!/usr/bin/env bash
# One idempotent set-up step for `make demo` and `make test` on a fresh Debian 12 machine:
# installs the Debian packages the build needs, and nothing when they are already there.
set -euo pipefail

packages=(
  cmake g++ make pkg-config clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev
  libhwy-dev libomp-dev
  clang libclang-rt-dev  # clang++ and its libFuzzer/TSan runtimes: the fuzz and tsan presets (scripts/fuzz.sh, the TSan job)
  mesa-vulkan-drivers libvulkan1  # the webgpu backend's Vulkan device where there is no GPU (lavapipe)
  dict-devil bible-kjv-text bible-kjv  # the Python evaluation's corpora (bible-kjv decodes bible-kjv-text's file)
)
python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)  # fetches the pinned wgpu wheel below
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || packages+=(python3-venv)  # the Python tests' own venv

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo_cmd apt-get update -qq
  $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# wgpu-native for the webgpu backend (from the pinned `wgpu` wheel on PyPI), into build/third_party.
"$(dirname "$0")/fetch_wgpu_native.sh"
