// TurboQuant query rotation (docs/spec.md §2): one workgroup per (query row, head), thread d owns
// coordinate d. q_rot = RHT_polar(q), q_jl = RHT_jl(q_rot), sum = sum_d q_jl[d], into the scratch
// [q_rot | q_jl | sums] at row b * n_queries + j.

struct Params {
  D: u32, nq: u32, H: u32, dtype: u32,
  region: u32, scratch_off: u32, row0: u32, pad1: u32,  // row0: first row of this dispatch
  q_off: u32, q_sb: u32, q_ss: u32, q_sh: u32,
  polar: array<vec4<u32>, 2>,
  jl: array<vec4<u32>, 2>,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<u32>;
@group(0) @binding(2) var<storage, read_write> SCRATCH: array<f32>;

fn sign_of(signs: array<vec4<u32>, 2>, d: u32) -> f32 {
  let w = d / 32u;
  return select(1.0, -1.0, ((signs[w / 4u][w % 4u] >> (d % 32u)) & 1u) != 0u);
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tid = lid.x;
  let row = P.row0 + wid.x;
  let h = wid.y;
  let D = P.D;
  let b = row / P.nq;
  let j = row % P.nq;
  let inv = 1.0 / sqrt(f32(D));
  if (tid < D) {
    let i = P.q_off + b * P.q_sb + j * P.q_ss + h * P.q_sh + tid;
    fwht_x[tid] = widen(Q[word_of(i, P.dtype)], i, P.dtype) * sign_of(P.polar, tid);
  }
  workgroupBarrier();
  for (var stage = 0u; stage < 2u; stage++) {  // RHT_polar, then RHT_jl of its result
    for (var len = 1u; len < D; len <<= 1u) {
      fwht_round(tid, len, D);
      workgroupBarrier();
    }
    if (tid < D) {
      let y = fwht_x[tid] * inv;
      let at = scratch_vector(P.scratch_off, P.region, stage, row, P.H, h, D) + tid;
      SCRATCH[at] = y;
      fwht_x[tid] = y * select(1.0, sign_of(P.jl, tid), stage == 0u);
    }
    workgroupBarrier();
  }
  if (tid == 0u) {
    var s = 0.0;
    for (var d = 0u; d < D; d++) { s += fwht_x[d]; }  // fwht_x holds q_jl after the second stage
    SCRATCH[scratch_sum(P.scratch_off, P.region, row, P.H, h)] = s;
  }
}
