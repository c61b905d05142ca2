// The adapter's arithmetic peak, for the benchmark's physical limits (flashtq bench --gpu): every invocation runs
// `iterations` rounds of eight independent vec4 multiply-add chains (64 FLOP a round) in Real: f32, or f16 in the
// "real-f16" variant (on an adapter with shader-f16); the result is stored so that nothing is optimised away.

alias Real = f32;

struct Params {
  iterations: u32, pad0: u32, pad1: u32, pad2: u32,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read_write> SINK: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let seed = Real(gid.x & 1023u) * Real(1e-3);
  var a = array<vec4<Real>, 8>();
  for (var c = 0u; c < 8u; c++) { a[c] = vec4<Real>(seed + Real(c), Real(1), Real(2), Real(3)); }
  let x = vec4<Real>(Real(0.999));
  let y = vec4<Real>(Real(1e-3));
  for (var i = 0u; i < P.iterations; i++) {
    a[0] = fma(a[0], x, y); a[1] = fma(a[1], x, y); a[2] = fma(a[2], x, y); a[3] = fma(a[3], x, y);
    a[4] = fma(a[4], x, y); a[5] = fma(a[5], x, y); a[6] = fma(a[6], x, y); a[7] = fma(a[7], x, y);
  }
  var s = vec4<Real>(Real(0));
  for (var c = 0u; c < 8u; c++) { s += a[c]; }
  SINK[gid.x] = f32(s.x + s.y + s.z + s.w);
}
