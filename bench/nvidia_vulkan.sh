#!/usr/bin/env bash
# Source this on an NVIDIA machine before running the webgpu backend there. The NVIDIA Vulkan driver
# (libGLX_nvidia.so.0) loads only where glvnd's libGLdispatch.so.0 is installed: containers set up
# for compute alone often lack it, and the Vulkan loader then finds no adapter without saying why.
# Measured on the lent H200 container: no adapter without libglvnd0; with the Debian packages
# libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2 libvulkan1 unpacked, the driver's own manifest
# works. Where no manifest for NVIDIA is installed at all, this writes one for libGLX_nvidia.so.0.
if ! ldconfig -p 2>/dev/null | grep -q "libGLdispatch.so.0"; then
  echo "nvidia_vulkan.sh: libGLdispatch.so.0 (Debian libglvnd0) is missing: the NVIDIA Vulkan driver will not load." >&2
  echo "  Install libglvnd0 libegl1 libgl1 libglx0 libvulkan1 (apt-get install, or dpkg -x of downloaded .debs, then ldconfig)." >&2
fi
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] &&
   ! ls /usr/share/vulkan/icd.d/nvidia* >/dev/null 2>&1 && ! ls /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
  if [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then  # mounted with the driver
    export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  else
    glx=$(ldconfig -p 2>/dev/null | awk '/libGLX_nvidia.so.0/ {print $NF; exit}')
    if [ -n "$glx" ]; then
      icd_dir=$(mktemp -d)
      printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}\n' "$glx" > "$icd_dir/nvidia_icd.json"
      export VK_DRIVER_FILES="$icd_dir/nvidia_icd.json"
      echo "nvidia_vulkan.sh: Vulkan ICD manifest for $glx in $icd_dir" >&2
    else
      echo "nvidia_vulkan.sh: no libGLX_nvidia.so.0 here: Vulkan will not see the NVIDIA GPU" >&2
    fi
  fi
fi
