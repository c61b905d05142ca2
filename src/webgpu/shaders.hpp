// The WGSL kernels (src/webgpu/shaders/*.wgsl), embedded at build time.
#pragma once

#include <string>

namespace flashtq::webgpu {

// The source of shader `name` (the file name without .wgsl) with the preludes (_*.wgsl) before
// it; empty when there is no such shader.
std::string shader_source(const std::string& name);

}  // namespace flashtq::webgpu
