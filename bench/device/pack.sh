#!/usr/bin/env bash
# Builds .gpu/ (git-ignored), the folder a lent GPU machine gets through the device tool's `carry`: this
# checkout's built binaries (xz, to fit the carry limit), the shared libraries they need there, the glvnd and
# Vulkan loader packages for the webgpu backend, the peer wheels (../shared/peers: FlashInfer and its
# dependencies) and the driver bench/device/run.sh, which docs/benchmarks.md calls as `.gpu/run.sh`.
# Usage: bench/device/pack.sh (no arguments). For run.sh's AB mode, put further builds of cuda_turboquant_bench
# into .gpu/bin as bench_b.xz, bench_c.xz, ... yourself: this script rewrites only bench_a and leaves them.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=build/release
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
mkdir -p .gpu/bin .gpu/lib .gpu/vulkan .gpu/peers
for pair in tests/flashtq_tests:flashtq_tests tools/flashtq/flashtq:flashtq bench/cuda_turboquant_bench:bench_a; do
  xz -T0 -6 -c "$build/${pair%%:*}" > ".gpu/bin/${pair##*:}.xz"
done
for lib in libgomp.so.1 libhwy.so.1; do cp -L "/lib/x86_64-linux-gnu/$lib" .gpu/lib/; done
cp -L /usr/local/cuda/lib/libcudart.so.13 .gpu/lib/
xz -T0 -c build/third_party/wgpu-native/lib/libwgpu_native.so > .gpu/lib/libwgpu_native.so.xz
if ! ls .gpu/vulkan/*.deb >/dev/null 2>&1; then  # the device tool's README: glvnd and the Vulkan loader
  lists=$(mktemp -d); mkdir -p "$lists/partial"
  o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$lists"
  apt-get $o update >/dev/null
  (cd .gpu/vulkan && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
peers=../shared/peers
if [ -d "$peers" ]; then cp "$peers"/{flashinfer_python,apache_tvm_ffi,nvidia_ml_py}*.whl .gpu/peers/; fi
cp bench/device/run.sh .gpu/run.sh
du -sb .gpu | awk '{printf "pack.sh: .gpu holds %.1f MiB (carry allows 64)\n", $1 / 1048576}'
