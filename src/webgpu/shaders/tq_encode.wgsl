// TurboQuant encode (docs/spec.md §2): one workgroup per (timestep, kv head), thread d owns coordinate d.
// The oracle computes in double, and every norm word must equal its; so norms, the rotation, the
// residual and the comparisons with the codebook's boundaries run in double-float (_df64.wgsl).
// Keys: norm, codes of RHT_polar(k / |k|), residual norm and the QJL signs of H diag(s_jl) e.
// Every workgroupBarrier() sits in main, in uniform control flow (see the WebGPU issue's note on
// barriers reached through function calls).
// Values: norm and codes. Every word of the slot is written (zeros for a zero vector).
// `keys` means keys with the QJL bit: MSE-only keys are encoded as values are, with their own codebook.
// A sink or recent timestep also gets its exact row: n * RHT(x / n) in bf16 (round to nearest even).

struct Params {
  D: u32, n_kv: u32, capacity: u32, bits: u32,
  keys: u32, dtype: u32, start_pos: u32, T: u32,
  x_off: u32, x_sb: u32, x_ss: u32, x_sh: u32,
  cache_off: u32, code_words: u32, jl_off: u32, norm_off: u32,
  exact_off: u32, sink: u32, recent: u32, nc: u32,  // exact tokens, norm correction (docs/spec.md §2.6)
  polar: array<vec4<u32>, 2>,
  jl: array<vec4<u32>, 2>,
  inv_sqrt_d: vec2<f32>, one: f32, t0: u32,  // one = 1.0, opaque to the compiler (_df64.wgsl); t0: first timestep of this dispatch
  centroids: array<vec4<f32>, 8>,   // double-float pairs: entry i at [i / 2] components 2 (i % 2), +1
  boundaries: array<vec4<f32>, 8>,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> X: array<u32>;
@group(0) @binding(2) var<storage, read_write> CACHE: array<u32>;

const ZERO_NORM: f32 = 1e-12;

var<workgroup> hi: array<f32, 256>;
var<workgroup> lo: array<f32, 256>;
var<workgroup> total: vec2<f32>;
var<workgroup> decoded: vec2<f32>;  // |c[idx]|^2 of the row, for norm correction
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
fn centroid(i: u32) -> vec2<f32> {
  let v = P.centroids[i / 2u];
  return select(vec2<f32>(v.x, v.y), vec2<f32>(v.z, v.w), (i & 1u) == 1u);
}
fn boundary(i: u32) -> vec2<f32> {
  let v = P.boundaries[i / 2u];
  return select(vec2<f32>(v.x, v.y), vec2<f32>(v.z, v.w), (i & 1u) == 1u);
}

// One step of the tree sum of (hi, lo)[0..D): pairs (tid, tid + len). No barrier here: the
// loops and their barriers stay in main (see the header).
fn reduce_step(tid: u32, len: u32) {
  if (tid < len && tid + len < P.D) {
    let s = df_add(vec2<f32>(hi[tid], lo[tid]), vec2<f32>(hi[tid + len], lo[tid + len]));
    hi[tid] = s.x;
    lo[tid] = s.y;
  }
}

// One round of Walsh-Hadamard butterflies over (hi, lo)[0..D), span `len`.
fn butterfly_step(tid: u32, len: u32) {
  if (tid < P.D / 2u) {
    let i = (tid / len) * 2u * len + tid % len;
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
  let t = P.t0 + wid.x;
  let h = wid.y;
  let D = P.D;
  let in_range = tid < D;
  let slot = h * P.capacity + P.start_pos + t;
  if (tid < 32u) { atomicStore(&code_words[tid], 0u); }
  if (tid < 8u) { atomicStore(&jl_words[tid], 0u); }
  var x = 0.0;
  if (in_range) {
    let i = P.x_off + t * P.x_ss + h * P.x_sh + tid;
    x = widen(X[word_of(i, P.dtype)], i, P.dtype);
  }
  // n = |x|
  var sq = vec2<f32>(0.0, 0.0);
  if (in_range) { sq = two_prod(x, x); }
  hi[tid] = sq.x;
  lo[tid] = sq.y;
  workgroupBarrier();
  for (var len = 128u; len > 0u; len >>= 1u) {  // tree sum of (hi, lo)[0..D) into total
    reduce_step(tid, len);
    workgroupBarrier();
  }
  if (tid == 0u) { total = vec2<f32>(hi[0], lo[0]); }
  workgroupBarrier();
  let n = df_sqrt(total);
  workgroupBarrier();
  let zero = df_lt(n, vec2<f32>(ZERO_NORM, 0.0));
  // r = RHT_polar(x / n): signs, butterflies, 1/sqrt(D)
  var u = vec2<f32>(0.0, 0.0);
  if (in_range && !zero) {
    u = df_div(vec2<f32>(x, 0.0), n);
    if (flips(P.polar, tid)) { u = df_neg(u); }
  }
  hi[tid] = u.x;
  lo[tid] = u.y;
  workgroupBarrier();
  for (var len = 1u; len < D; len <<= 1u) {  // Walsh-Hadamard butterflies over (hi, lo)[0..D)
    butterfly_step(tid, len);
    workgroupBarrier();
  }
  var e = vec2<f32>(0.0, 0.0);
  var my_code = 0u;
  exact_bits[tid] = 0u;
  if (in_range && !zero) {
    let r = df_mul(vec2<f32>(hi[tid], lo[tid]), P.inv_sqrt_d);
    exact_bits[tid] = bf16_bits(df_mul(r, n).x);
    var idx = 0u;
    let n_bounds = (1u << P.bits) - 1u;
    for (var k = 0u; k < n_bounds; k++) {
      if (df_ge(r, boundary(k))) { idx = k + 1u; }
    }
    e = df_sub(r, centroid(idx));
    my_code = idx;
    // code stream: coordinate d at bits [d * bits, d * bits + bits), LSB first, across words
    let bit = tid * P.bits;
    atomicOr(&code_words[bit / 32u], idx << (bit % 32u));
    if ((bit % 32u) + P.bits > 32u) { atomicOr(&code_words[bit / 32u + 1u], idx >> (32u - bit % 32u)); }
  }
  workgroupBarrier();
  // |c[idx]|^2 (norm correction): a tree sum every invocation takes part in, so its barriers stay uniform.
  var c2 = vec2<f32>(0.0, 0.0);
  if (in_range && !zero) { c2 = df_mul(centroid(my_code), centroid(my_code)); }
  hi[tid] = c2.x;
  lo[tid] = c2.y;
  workgroupBarrier();
  for (var len = 128u; len > 0u; len >>= 1u) {  // tree sum of (hi, lo)[0..D) into decoded
    reduce_step(tid, len);
    workgroupBarrier();
  }
  if (tid == 0u) { decoded = vec2<f32>(hi[0], lo[0]); }
  workgroupBarrier();
  var gamma = vec2<f32>(0.0, 0.0);
  if (P.keys != 0u) {
    // gamma = |e|, then the signs of H diag(s_jl) e (the 1/sqrt(D) does not change a sign)
    var sq_e = vec2<f32>(0.0, 0.0);
    if (in_range) { sq_e = df_mul(e, e); }
    hi[tid] = sq_e.x;
    lo[tid] = sq_e.y;
    workgroupBarrier();
    for (var len = 128u; len > 0u; len >>= 1u) {  // tree sum of (hi, lo)[0..D) into total
      reduce_step(tid, len);
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
      butterfly_step(tid, len);
      workgroupBarrier();
    }
    if (in_range && !zero && !df_lt(gamma, vec2<f32>(ZERO_NORM, 0.0)) && df_ge(vec2<f32>(hi[tid], lo[tid]), vec2<f32>(0.0, 0.0))) {
      atomicOr(&jl_words[tid / 32u], 1u << (tid % 32u));
    }
    workgroupBarrier();
  }
  let words = P.code_words;
  let base = P.cache_off;
  let er = exact_row(P.start_pos + t, P.start_pos + P.T);
  if (er >= 0 && tid < D / 2u) {
    let exact_rows = P.sink + P.recent;
    CACHE[base + P.exact_off + (h * exact_rows + u32(er)) * (D / 2u) + tid] = exact_bits[2u * tid] | (exact_bits[2u * tid + 1u] << 16u);
  }
  if (tid < words) { CACHE[base + slot * words + tid] = atomicLoad(&code_words[tid]); }
  if (P.keys != 0u && tid < D / 32u) { CACHE[base + P.jl_off + slot * (D / 32u) + tid] = atomicLoad(&jl_words[tid]); }
  if (tid == 0u) {
    var word = 0u;
    if (!zero) {
      // f16(f32(n)): the double-float's hi is the f32 nearest to it
      var stored = n;
      if (P.nc != 0u) { stored = df_div(n, df_sqrt(decoded)); }
      word = f16_bits(stored.x);
      if (P.keys != 0u) { word |= f16_bits(gamma.x) << 16u; }
    }
    CACHE[base + P.norm_off + slot] = word;
  }
}
