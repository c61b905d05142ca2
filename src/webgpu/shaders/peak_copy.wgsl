// The bandwidth a kernel reaches, for the benchmark's physical limits (flashtq bench --gpu): `n` 16-byte words
// read from SRC and written to DST, each invocation taking words gid, gid + stride, ... (stride: the dispatch's
// invocations), so that neighbouring invocations touch neighbouring words. A buffer-to-buffer copy command is
// not this limit: on NVIDIA's Vulkan driver it runs at a fraction of what shaders reach.

struct Params {
  n: u32, stride: u32, pad0: u32, pad1: u32,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> SRC: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> DST: array<vec4<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  for (var i = gid.x; i < P.n; i += P.stride) { DST[i] = SRC[i]; }
}
