#!/usr/bin/env bash
# Source this on an NVIDIA machine whose container has the driver's Vulkan library but no Vulkan
# ICD manifest (common where only compute was set up): writes a manifest for libGLX_nvidia.so.0 and
# points the Vulkan loader at it. Does nothing where a manifest for NVIDIA is already installed.
if ! ls /usr/share/vulkan/icd.d/nvidia* >/dev/null 2>&1 && ! ls /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
  glx=$(ldconfig -p 2>/dev/null | awk '/libGLX_nvidia.so.0/ {print $NF; exit}')
  if [ -n "$glx" ]; then
    icd_dir=$(mktemp -d)
    printf '{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}\n' "$glx" > "$icd_dir/nvidia_icd.json"
    export VK_ICD_FILENAMES="$icd_dir/nvidia_icd.json"
    echo "nvidia_vulkan.sh: Vulkan ICD manifest for $glx in $icd_dir" >&2
  else
    echo "nvidia_vulkan.sh: no libGLX_nvidia.so.0 here: Vulkan will not see the NVIDIA GPU" >&2
  fi
fi
