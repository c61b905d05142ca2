// The attention sinks' gradient (docs/spec.md §1.9), after the dense backward's dq kernel has written
// delta_i = <dout_i, out_i>: dsinks[h] = -sum over (b, i) of min(exp(sinks[h] - lse_i), 1) * delta_i. One
// workgroup per head sums its rows in a fixed order (a strided pass, then a tree), so the result is
// deterministic; a sink of -inf (none) gets 0.

struct Params {
  B: u32, Sq: u32, H: u32, lse_off: u32,
  sinks_off: u32, dsinks_off: u32, y0: u32, pad: u32,  // y0: first head of this dispatch
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> LSE: array<f32>;
@group(0) @binding(2) var<storage, read> DELTA: array<f32>;
@group(0) @binding(3) var<storage, read> SINKS: array<f32>;
@group(0) @binding(4) var<storage, read_write> DSINKS: array<f32>;

const THREADS: u32 = 64u;
var<workgroup> partial: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let h = P.y0 + wid.x;
  let sink = SINKS[P.sinks_off + h];
  var acc = 0.0;
  if (sink > bitcast<f32>(NEG_INF_BITS)) {
    for (var n = lid.x; n < P.B * P.Sq; n += THREADS) {
      let row = (n / P.Sq * P.H + h) * P.Sq + n % P.Sq;
      let lse = LSE[P.lse_off + row];
      if (lse > bitcast<f32>(NEG_INF_BITS)) { acc -= min(exp(sink - lse), 1.0) * DELTA[row]; }
    }
  }
  partial[lid.x] = acc;
  workgroupBarrier();
  for (var half = THREADS / 2u; half > 0u; half /= 2u) {
    if (lid.x < half) { partial[lid.x] += partial[lid.x + half]; }
    workgroupBarrier();
  }
  if (lid.x == 0u) { DSINKS[P.dsinks_off + h] = partial[0]; }
}
