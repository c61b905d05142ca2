// TurboQuant query rotation (docs/spec.md §2): one workgroup per (query row, head), thread d owns
// coordinate d. q_rot = RHT_polar(q), q_jl = RHT_jl(q_rot), sum = sum_d q_jl[d], into the scratch
// [q_rot | q_jl | sums] at row b * n_queries + j.
// Keys with outlier channels (docs/turboquant_layout.md): q's channels are permuted by its kv head's mask
// (read from sequence b's key words) and each part rotated on its own, as the keys are (_tq_parts.wgsl);
// such keys have no QJL bits, so q_jl and its sum are 0.

struct Params {
  D: u32, nq: u32, H: u32, dtype: u32,
  region: u32, scratch_off: u32, row0: u32, n_kv: u32,  // row0: first row of this dispatch
  q_off: u32, q_sb: u32, q_ss: u32, q_sh: u32,
  n_parts: u32, outliers: u32, k_off: u32, key_words: u32,
  mask_off: u32, pad0: u32, pad1: u32, pad2: u32,
  polar: array<vec4<u32>, 2>,
  jl: array<vec4<u32>, 2>,
  parts: array<vec4<u32>, 6>,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<u32>;
@group(0) @binding(2) var<storage, read_write> SCRATCH: array<f32>;
@group(0) @binding(3) var<storage, read> KEYS: array<u32>;  // with outlier channels: the masks

fn sign_of(signs: array<vec4<u32>, 2>, d: u32) -> f32 {
  let w = d / 32u;
  return select(1.0, -1.0, ((signs[w / 4u][w % 4u] >> (d % 32u)) & 1u) != 0u);
}

// Where channel c of query row `row`, head h goes: its place in the kv head's permuted key.
fn position(row: u32, h: u32, c: u32) -> u32 {
  if (P.outliers == 0u) { return c; }
  let base = P.k_off + (row / P.nq) * P.key_words + P.mask_off + (h / (P.H / P.n_kv)) * (P.D / 32u);
  var mask: array<u32, 8>;
  for (var w = 0u; w < P.D / 32u; w++) { mask[w] = KEYS[base + w]; }
  return key_position(mask, P.D, P.outliers, c);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tid = lid.x;
  let row = P.row0 + wid.x;
  let h = wid.y;
  let D = P.D;
  let b = row / P.nq;
  let j = row % P.nq;
  let part = P.parts[part_of(P.parts, P.n_parts, min(tid, D - 1u))];
  let pair_part = P.parts[part_of(P.parts, P.n_parts, min(2u * tid, D - 1u))];  // of butterfly pair tid
  if (tid < D) {
    let i = P.q_off + b * P.q_sb + j * P.q_ss + h * P.q_sh + tid;
    let at = position(row, h, tid);
    fwht_x[at] = widen(Q[word_of(i, P.dtype)], i, P.dtype) * sign_of(P.polar, at);
  }
  workgroupBarrier();
  let stages = select(2u, 1u, P.outliers != 0u);  // RHT_polar, then (with QJL bits) RHT_jl of its result
  for (var stage = 0u; stage < stages; stage++) {
    for (var len = 1u; len < D; len <<= 1u) {
      fwht_part_round(tid, len, D, pair_part);
      workgroupBarrier();
    }
    if (tid < D) {
      let y = fwht_x[tid] * (1.0 / sqrt(f32(part.y)));
      let at = scratch_vector(P.scratch_off, P.region, stage, row, P.H, h, D) + tid;
      SCRATCH[at] = y;
      fwht_x[tid] = y * select(1.0, sign_of(P.jl, tid), stage == 0u);
    }
    workgroupBarrier();
  }
  if (P.outliers != 0u) {
    if (tid < D) { SCRATCH[scratch_vector(P.scratch_off, P.region, 1u, row, P.H, h, D) + tid] = 0.0; }
    if (tid == 0u) { SCRATCH[scratch_sum(P.scratch_off, P.region, row, P.H, h)] = 0.0; }
    return;
  }
  if (tid == 0u) {
    var s = 0.0;
    for (var d = 0u; d < D; d++) { s += fwht_x[d]; }  // fwht_x holds q_jl after the second stage
    SCRATCH[scratch_sum(P.scratch_off, P.region, row, P.H, h)] = s;
  }
}
