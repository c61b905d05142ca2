// The physical limits of the process's WebGPU adapter, measured with its own kernels: what `flashtq bench --gpu`
// puts beside each row (the copy bandwidth for packed caches, the f32 and f16 FMA peaks for dense attention).
#pragma once

#include <optional>

namespace flashtq::webgpu {

struct Peaks {
  double copy_gbs = 0;          // the faster of the two below: bytes read plus bytes written per second
  double copy_command_gbs = 0;  // the queue's buffer-to-buffer copy
  double copy_kernel_gbs = 0;   // a copy kernel (peak_copy.wgsl)
  double f32_tflops = 0;        // vec4 f32 multiply-adds (peak_fma.wgsl), 2 FLOP each
  double f16_tflops = 0;        // the same in f16 (its real-f16 variant); 0 without shader-f16
};

// Medians of a few runs each; nullopt when there is no usable adapter.
std::optional<Peaks> measure_peaks();

}  // namespace flashtq::webgpu
