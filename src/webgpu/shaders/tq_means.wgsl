// Block means (docs/turboquant_layout.md, "block means"): one workgroup per (block whose first timestep
// this encode codes, kv head); thread k makes word k of the mean, coordinates 2k and 2k + 1:
// mu_b[d] = f16((sum of the block's g exact rows' element d) / g). The rows (bf16, already rotated) are
// the encoder's ROWS (tq_encode.wgsl), row u - first of each head's n_rows for timestep u. The sum runs in
// double-float, where bf16 values of one row's scale add exactly, as in the oracle's double; / g (a power
// of two) is exact, and the double-float's hi is the f32 nearest to it, which f16_bits rounds.

struct Params {
  D: u32, n_rows: u32, block: u32, first: u32,
  first_block: u32, b0: u32, cache_off: u32, mean_off: u32,  // b0: first block of this dispatch
  mean_blocks: u32, one: f32, moved: u32, pad1: u32,  // one = 1.0, opaque to the compiler (_df64.wgsl)
  // moved: a pool's blocks of this dispatch lie in one page, `moved` blocks from where a contiguous image has them
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> ROWS: array<u32>;
@group(0) @binding(2) var<storage, read_write> CACHE: array<u32>;

// A zero of either sign is +0 (docs/turboquant_layout.md, block means): the double-float sum keeps terms the
// oracle's double drops, so where the sum cancels to within f16's range of zero their signs can differ.
fn mean_bits(x: f32) -> u32 {
  let h = f16_bits(x);
  return select(h, 0u, (h & 0x7fffu) == 0u);
}

@compute @workgroup_size(128)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  df_one = P.one;
  let k = lid.x;
  let b = P.first_block + P.b0 + wid.x;
  let h = wid.y;
  let words = P.D / 2u;
  if (k >= words) { return; }
  var even = vec2<f32>(0.0, 0.0);
  var odd = vec2<f32>(0.0, 0.0);
  for (var u = b * P.block; u < (b + 1u) * P.block; u++) {
    let w = ROWS[(h * P.n_rows + u - P.first) * words + k];
    even = df_add(even, vec2<f32>(bitcast<f32>(w << 16u), 0.0));
    odd = df_add(odd, vec2<f32>(bitcast<f32>(w & 0xffff0000u), 0.0));
  }
  let inv = 1.0 / f32(P.block);
  let mean = mean_bits(even.x * inv) | (mean_bits(odd.x * inv) << 16u);
  CACHE[P.cache_off + P.mean_off + (h * P.mean_blocks + b + P.moved) * words + k] = mean;
}
