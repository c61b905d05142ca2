// peak_fma.wgsl in f16: built only as the "enable-f16" variant, on an adapter with shader-f16.

struct Params {
  iterations: u32, pad0: u32, pad1: u32, pad2: u32,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> SINK: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let seed = f16(gid.x & 1023u) * 1e-3h;
  var a = array<vec4<f16>, 8>();
  for (var c = 0u; c < 8u; c++) { a[c] = vec4<f16>(seed + f16(c), 1.0h, 2.0h, 3.0h); }
  let x = vec4<f16>(0.999h);
  let y = vec4<f16>(1e-3h);
  for (var i = 0u; i < P.iterations; i++) {
    a[0] = fma(a[0], x, y); a[1] = fma(a[1], x, y); a[2] = fma(a[2], x, y); a[3] = fma(a[3], x, y);
    a[4] = fma(a[4], x, y); a[5] = fma(a[5], x, y); a[6] = fma(a[6], x, y); a[7] = fma(a[7], x, y);
  }
  var s = vec4<f16>(0.0h);
  for (var c = 0u; c < 8u; c++) { s += a[c]; }
  SINK[gid.x] = f32(s.x + s.y + s.z + s.w);
}
