// TurboQuant encode (docs/spec.md §2, docs/turboquant_layout.md): one workgroup per (row, kv head), thread i
// owns coordinate i of the coded vector. The oracle computes in double, and every norm word must equal its;
// so norms, the rotation, the residual and the comparisons with the codebook's boundaries run in
// double-float (_df64.wgsl). Every workgroupBarrier() sits in main, in uniform control flow (see the
// WebGPU issue's note on barriers reached through function calls).
// The vector is coded in parts (_tq_parts.wgsl): keys with outlier channels permute their channels by
// the kv head's mask and code each part as a vector of its own (its norm, its rotation over its slice of
// the signs, its coordinates spread by sqrt(size / D) to head_dim's codebook, its norm half); every other
// vector is one part, spread 1. `qjl` means keys with the QJL bit: the residual's norm and the signs of
// H diag(s_jl) e; every other side is coded as values are, with its own codebook.
// Modes (uniform):
//   0: rows of x into their slots: codes and norm words (every word of the slot, zeros for a zero
//      vector), and for a sink or recent timestep its exact row n * RHT(x / n) in bf16.
//   1: rows of x of a side with block means: their exact rows only, into ROWS, for the means and the
//      residuals (row rows_first + t of its head's n_rows rows).
//   2: residuals (block means, core::put_residual): ROWS row t (timestep start_pos - rows_first + t),
//      already rotated, minus its block's f16 mean, coded into its slot.

struct Params {
  D: u32, n_kv: u32, capacity: u32, qjl: u32,
  dtype: u32, start_pos: u32, T: u32, t0: u32,  // t0: first row of this dispatch
  x_off: u32, x_sb: u32, x_ss: u32, x_sh: u32,
  cache_off: u32, code_words: u32, jl_off: u32, norm_off: u32,
  exact_off: u32, sink: u32, recent: u32, nc: u32,  // exact tokens, norm correction (docs/spec.md §2.6)
  mode: u32, n_parts: u32, outliers: u32, mask_off: u32,
  norm_words: u32, mean_off: u32, mean_blocks: u32, block: u32,
  rows_first: u32, n_rows: u32, one: f32, pad: u32,  // one = 1.0, opaque to the compiler (_df64.wgsl)
  // A pool (docs/turboquant_layout.md, "Pages"): the dispatch's rows start at row_base and lie in one page, their
  // timesteps `moved` slots from where a contiguous image has them (mod 2^32); 0 and 0 for a contiguous image.
  row_base: u32, moved: u32, pad1: u32, pad2: u32,
  polar: array<vec4<u32>, 2>,
  jl: array<vec4<u32>, 2>,
  parts: array<vec4<u32>, 6>,
  scales: array<vec4<f32>, 6>,  // per part, double-float: 1 / sqrt(size), then sqrt(size / D)
  // Codebooks in double-float pairs: entry i at [i / 2] components 2 (i % 2), +1; the outlier part's apart.
  centroids: array<vec4<f32>, 8>,
  boundaries: array<vec4<f32>, 8>,
  outlier_centroids: array<vec4<f32>, 8>,
  outlier_boundaries: array<vec4<f32>, 8>,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<u32>;
@group(0) @binding(2) var<storage, read_write> CACHE: array<u32>;
@group(0) @binding(3) var<storage, read_write> ROWS: array<u32>;  // bf16 rows, head-major (modes 1, 2)

const ZERO_NORM: f32 = 1e-12;

var<workgroup> hi: array<f32, 256>;
var<workgroup> lo: array<f32, 256>;
var<workgroup> permuted: array<f32, 256>;  // x in the coded order
var<workgroup> part_sq: array<vec2<f32>, 6>;  // |x_p|^2 of each part
var<workgroup> part_c2: array<vec2<f32>, 6>;  // |c[idx_p]|^2 of each part, for norm correction
var<workgroup> halves: array<u32, 6>;  // the f16 halves of the norm words, low first
var<workgroup> total: vec2<f32>;
var<workgroup> code_words: array<atomic<u32>, 32>;
var<workgroup> jl_words: array<atomic<u32>, 8>;
var<workgroup> exact_bits: array<u32, 256>;

// The exact row that holds timestep t of a sequence ending at `end`, or -1 (TqLayout::exact_row).
fn exact_row(t: u32, end: u32) -> i32 {
  if (t < P.sink) { return i32(t); }
  if (P.recent > 0u && t + P.recent >= end) { return i32(P.sink + (t - P.sink) % P.recent); }
  return -1;
}

fn flips(signs: array<vec4<u32>, 2>, d: u32) -> bool {
  let w = d / 32u;
  return ((signs[w / 4u][w % 4u] >> (d % 32u)) & 1u) != 0u;
}
fn pick(v: vec4<f32>, i: u32) -> vec2<f32> { return select(vec2<f32>(v.x, v.y), vec2<f32>(v.z, v.w), (i & 1u) == 1u); }
fn centroid(outlier: bool, i: u32) -> vec2<f32> {
  return select(pick(P.centroids[i / 2u], i), pick(P.outlier_centroids[i / 2u], i), outlier);
}
fn boundary(outlier: bool, i: u32) -> vec2<f32> {
  return select(pick(P.boundaries[i / 2u], i), pick(P.outlier_boundaries[i / 2u], i), outlier);
}

// The outlier mask of kv head h.
fn head_mask(h: u32) -> array<u32, 8> {
  var m: array<u32, 8>;
  for (var w = 0u; w < P.D / 32u; w++) { m[w] = CACHE[P.cache_off + P.mask_off + h * (P.D / 32u) + w]; }
  return m;
}

// One step of the tree sums of (hi, lo) over each part: coordinate i adds i + len of its part (offset,
// size, ..), so each part's sum ends at its first coordinate. No barrier here (see the header).
fn reduce_step(i: u32, len: u32, part: vec4<u32>) {
  let k = i - part.x;
  if (k < len && k + len < part.y) {
    let s = df_add(vec2<f32>(hi[i], lo[i]), vec2<f32>(hi[i + len], lo[i + len]));
    hi[i] = s.x;
    lo[i] = s.y;
  }
}
// Each part's sum after the tree sums, for thread p < n_parts.
fn part_sum(p: u32) -> vec2<f32> {
  let at = P.parts[p].x;
  return vec2<f32>(hi[at], lo[at]);
}

// One round of Walsh-Hadamard butterflies over (hi, lo), span `len`, each part on its own: pair k of
// the whole vector lies in `part` (the part of coordinate 2k).
fn butterfly_step(k: u32, len: u32, part: vec4<u32>) {
  if (k < P.D / 2u && len < part.y) {
    let i = butterfly_low(k - part.x / 2u, len, part.x);
    let a = vec2<f32>(hi[i], lo[i]);
    let b = vec2<f32>(hi[i + len], lo[i + len]);
    let s = df_add(a, b);
    let t = df_sub(a, b);
    hi[i] = s.x;
    lo[i] = s.y;
    hi[i + len] = t.x;
    lo[i + len] = t.y;
  }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  df_one = P.one;
  let tid = lid.x;
  let t = P.row_base + P.t0 + wid.x;
  let h = wid.y;
  let D = P.D;
  let in_range = tid < D;
  let residual = P.mode == 2u;
  let u = select(P.start_pos + t, P.start_pos - P.rows_first + t, residual);  // the timestep
  let at = u + P.moved;  // the timestep's slot in the image (a pool's page)
  let slot = h * P.capacity + at;
  let p = part_of(P.parts, P.n_parts, min(tid, D - 1u));
  let part = P.parts[p];  // offset, size, bits, bit_offset
  let pair_part = P.parts[part_of(P.parts, P.n_parts, min(2u * tid, D - 1u))];  // of butterfly pair tid
  let outlier = P.outliers != 0u && p == 0u;
  if (tid < 32u) { atomicStore(&code_words[tid], 0u); }
  if (tid < 8u) { atomicStore(&jl_words[tid], 0u); }
  // v: coordinate tid of the vector to code (a row of x in the coded order, or a residual)
  var v = vec2<f32>(0.0, 0.0);
  if (residual) {
    if (in_range) {
      let row = (h * P.n_rows + t) * (D / 2u) + tid / 2u;
      let mean = P.cache_off + P.mean_off + (h * P.mean_blocks + at / P.block) * (D / 2u) + tid / 2u;
      let r = bitcast<f32>(((ROWS[row] >> (16u * (tid % 2u))) & 0xffffu) << 16u);
      v = two_sum(r, -unpack2x16float(CACHE[mean])[tid % 2u]);  // exact, as the double difference is
    }
  } else {
    if (in_range) {
      let i = P.x_off + t * P.x_ss + h * P.x_sh + tid;
      var at = tid;
      if (P.outliers != 0u) { at = key_position(head_mask(h), D, P.outliers, tid); }
      permuted[at] = widen(X[word_of(i, P.dtype)], i, P.dtype);
    }
    workgroupBarrier();
    if (in_range) { v = vec2<f32>(permuted[tid], 0.0); }
  }
  // n_p = |v_p| per part, n = |v|
  var sq = vec2<f32>(0.0, 0.0);
  if (in_range) { sq = df_mul(v, v); }
  hi[tid] = sq.x;
  lo[tid] = sq.y;
  workgroupBarrier();
  for (var len = 128u; len > 0u; len >>= 1u) {  // tree sums of (hi, lo) over each part
    reduce_step(tid, len, part);
    workgroupBarrier();
  }
  if (tid < P.n_parts) { part_sq[tid] = part_sum(tid); }
  workgroupBarrier();
  var all_sq = vec2<f32>(0.0, 0.0);
  for (var q = 0u; q < P.n_parts; q++) { all_sq = df_add(all_sq, part_sq[q]); }
  let n = df_sqrt(all_sq);
  let n_p = df_sqrt(part_sq[p]);
  let zero = df_lt(n, vec2<f32>(ZERO_NORM, 0.0));
  let part_zero = df_lt(n_p, vec2<f32>(ZERO_NORM, 0.0));  // codes and norm half 0, decoded as zeros
  // r = RHT_polar(v_p / n_p) per part (signs, butterflies, 1 / sqrt(size)); residuals are rotated already
  var w = vec2<f32>(0.0, 0.0);
  if (in_range && !part_zero) {
    w = df_div(v, n_p);
    if (!residual && flips(P.polar, tid)) { w = df_neg(w); }
  }
  hi[tid] = w.x;
  lo[tid] = w.y;
  workgroupBarrier();
  if (!residual) {
    for (var len = 1u; len < D; len <<= 1u) {  // Walsh-Hadamard butterflies over each part of (hi, lo)
      butterfly_step(tid, len, pair_part);
      workgroupBarrier();
    }
  }
  var r = vec2<f32>(hi[tid], lo[tid]);
  if (!residual) { r = df_mul(r, P.scales[p].xy); }
  exact_bits[tid] = 0u;
  if (in_range && !part_zero && !residual) {
    // the exact row n * (r * (n_p / n)), in the oracle's order (one part: n * r)
    exact_bits[tid] = bf16_bits(df_mul(df_mul(r, df_div(n_p, n)), n).x);
  }
  var e = vec2<f32>(0.0, 0.0);
  var my_code = 0u;
  if (in_range && !part_zero) {
    let y = df_mul(r, P.scales[p].zw);  // spread to head_dim's codebook
    var idx = 0u;
    let n_bounds = (1u << part.z) - 1u;
    for (var k = 0u; k < n_bounds; k++) {
      if (df_ge(y, boundary(outlier, k))) { idx = k + 1u; }
    }
    e = df_sub(r, centroid(outlier, idx));  // the QJL residual (keys with QJL: one part, spread 1)
    my_code = idx;
    // code stream: coordinate i of part p at bits [bit_offset + (i - offset) * bits, + bits), LSB first
    let bit = part.w + (tid - part.x) * part.z;
    atomicOr(&code_words[bit / 32u], idx << (bit % 32u));
    if ((bit % 32u) + part.z > 32u) { atomicOr(&code_words[bit / 32u + 1u], idx >> (32u - bit % 32u)); }
  }
  workgroupBarrier();
  if (P.mode == 1u) {
    if (tid < D / 2u) {
      ROWS[(h * P.n_rows + P.rows_first + t) * (D / 2u) + tid] = exact_bits[2u * tid] | (exact_bits[2u * tid + 1u] << 16u);
    }
    return;
  }
  // |c[idx_p]|^2 per part (norm correction): tree sums every invocation takes part in, so barriers stay uniform.
  var c2 = vec2<f32>(0.0, 0.0);
  if (in_range && !part_zero) { c2 = df_mul(centroid(outlier, my_code), centroid(outlier, my_code)); }
  hi[tid] = c2.x;
  lo[tid] = c2.y;
  workgroupBarrier();
  for (var len = 128u; len > 0u; len >>= 1u) {  // tree sums of (hi, lo) over each part
    reduce_step(tid, len, part);
    workgroupBarrier();
  }
  if (tid < P.n_parts) { part_c2[tid] = part_sum(tid); }
  workgroupBarrier();
  var gamma = vec2<f32>(0.0, 0.0);
  if (P.qjl != 0u) {
    // gamma = |e|, then the signs of H diag(s_jl) e (the 1/sqrt(D) does not change a sign)
    var sq_e = vec2<f32>(0.0, 0.0);
    if (in_range) { sq_e = df_mul(e, e); }
    hi[tid] = sq_e.x;
    lo[tid] = sq_e.y;
    workgroupBarrier();
    for (var len = 128u; len > 0u; len >>= 1u) {  // tree sum of (hi, lo)[0..D) into total
      reduce_step(tid, len, part);
      workgroupBarrier();
    }
    if (tid == 0u) { total = vec2<f32>(hi[0], lo[0]); }
    workgroupBarrier();
    gamma = df_sqrt(total);
    workgroupBarrier();
    var f = e;
    if (in_range && flips(P.jl, tid)) { f = df_neg(f); }
    hi[tid] = f.x;
    lo[tid] = f.y;
    workgroupBarrier();
    for (var len = 1u; len < D; len <<= 1u) {  // Walsh-Hadamard butterflies over (hi, lo)[0..D)
      butterfly_step(tid, len, pair_part);
      workgroupBarrier();
    }
    if (in_range && !zero && !df_lt(gamma, vec2<f32>(ZERO_NORM, 0.0)) && df_ge(vec2<f32>(hi[tid], lo[tid]), vec2<f32>(0.0, 0.0))) {
      atomicOr(&jl_words[tid / 32u], 1u << (tid % 32u));
    }
    workgroupBarrier();
  }
  // The norm halves: part q's f16(n_q / sqrt(size / D)), or f16(n_q / |c[idx_q]|) with norm correction;
  // keys with QJL hold f16(gamma) in the high half of their one word.
  if (tid < 6u) {
    var half = 0u;
    if (tid < P.n_parts && !zero) {
      let nq = df_sqrt(part_sq[tid]);
      if (!df_lt(nq, vec2<f32>(ZERO_NORM, 0.0))) {
        var stored = df_div(nq, P.scales[tid].zw);
        if (P.nc != 0u) { stored = df_div(nq, df_sqrt(part_c2[tid])); }
        half = f16_bits(stored.x);  // f16(f32(n)): the double-float's hi is the f32 nearest to it
      }
    }
    if (tid == 1u && P.qjl != 0u && !zero) { half = f16_bits(gamma.x); }
    halves[tid] = half;
  }
  workgroupBarrier();
  let base = P.cache_off;
  let er = exact_row(u, P.start_pos + P.T);
  if (!residual && er >= 0 && tid < D / 2u) {
    let exact_rows = P.sink + P.recent;
    CACHE[base + P.exact_off + (h * exact_rows + u32(er)) * (D / 2u) + tid] = exact_bits[2u * tid] | (exact_bits[2u * tid + 1u] << 16u);
  }
  if (tid < P.code_words) { CACHE[base + slot * P.code_words + tid] = atomicLoad(&code_words[tid]); }
  if (P.qjl != 0u && tid < D / 32u) { CACHE[base + P.jl_off + slot * (D / 32u) + tid] = atomicLoad(&jl_words[tid]); }
  if (tid < P.norm_words) { CACHE[base + P.norm_off + slot * P.norm_words + tid] = halves[2u * tid] | (halves[2u * tid + 1u] << 16u); }
}
