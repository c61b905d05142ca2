#!/usr/bin/env bash
# wgpu-native for the webgpu backend, from the pinned `wgpu` wheel on PyPI (it carries the shared
# library and webgpu.h / wgpu.h): unpacks only those files into build/third_party/wgpu-native.
# Idempotent; called by scripts/setup.sh. The backend loads the library at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.32.0
dest=build/third_party/wgpu-native
if [ -f "$dest/VERSION" ] && [ "$(cat "$dest/VERSION")" = "$version" ]; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for attempt in 1 2 3; do  # a registry hiccup should not fail the set-up
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --python-version 3.11 "wgpu==$version" -d "$tmp" && break
  [ "$attempt" -lt 3 ] || { echo "fetch_wgpu_native: could not download wgpu==$version" >&2; exit 1; }
  sleep 5
done
mkdir -p "$dest/include" "$dest/lib"
python3 - "$tmp" "$dest" <<'PY'
import glob, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = glob.glob(f"{tmp}/wgpu-*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    for name, target in [("wgpu/resources/webgpu.h", "include/webgpu.h"), ("wgpu/resources/wgpu.h", "include/wgpu.h"),
                         ("wgpu/resources/libwgpu_native-release.so", "lib/libwgpu_native.so")]:
        with z.open(name) as src, open(f"{dest}/{target}", "wb") as out:
            out.write(src.read())
PY
echo "$version" > "$dest/VERSION"
echo "fetch_wgpu_native: wgpu-native from wgpu $version in $dest"
