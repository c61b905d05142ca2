// Dense attention backward (docs/spec.md §1), two entry points sharing one parameter block:
//   dq:   one invocation per query row (64 rows of one (batch, head) per workgroup, keys streamed
//         through workgroup memory); writes dq and delta_i = <dout_i, out_i> for dkdv.
//   dkdv: one invocation per key row (64 keys of one (batch, kv head) per workgroup, query rows
//         streamed); sums over every query head of the group, so no atomics and a fixed order.
// With P = exp(s - lse), f the dropout factor, dP = f <dout_i, v_j>, dS = P (dP - delta_i):
// dq_i = scale sum_j dS k_j, dk_j = scale sum_i dS q_i, dv_j = sum_i P f dout_i.
// A ragged batch (docs/spec.md §1.6) reads its sequences from TABLE (P.kv_layout 1); lse and delta are then [H, Tq].

struct Params {
  B: u32, Sq: u32, Sk: u32, H: u32,
  Hkv: u32, D: u32, dtype: u32, causal: u32,
  scale: f32, causal_offset: i32, window: i32, has_mask: u32,
  dropout_p: f32, seed: u32, tile: u32, lse_off: u32,
  q_off: u32, q_sb: u32, q_ss: u32, q_sh: u32,
  k_off: u32, k_sb: u32, k_ss: u32, k_sh: u32,
  v_off: u32, v_sb: u32, v_ss: u32, v_sh: u32,
  o_off: u32, o_sb: u32, o_ss: u32, o_sh: u32,
  do_off: u32, do_sb: u32, do_ss: u32, do_sh: u32,
  dq_off: u32, dq_sb: u32, dq_ss: u32, dq_sh: u32,
  dk_off: u32, dk_sb: u32, dk_ss: u32, dk_sh: u32,
  dv_off: u32, dv_sb: u32, dv_ss: u32, dv_sh: u32,
  m_off: u32, m_sb: u32, m_sh: u32, m_sq: u32,
  m_sk: u32, y0: u32, softcap: f32,  // y0: first (batch, head) of this dispatch
  // The sequence table (webgpu/backend.cpp's SequenceTable): layout 0 padded, 1 ragged.
  kv_layout: u32, from_end: u32, page_size: u32, max_pages: u32, total_q: u32,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<u32>;
@group(0) @binding(2) var<storage, read> K: array<u32>;
@group(0) @binding(3) var<storage, read> V: array<u32>;
@group(0) @binding(4) var<storage, read> OUT: array<u32>;
@group(0) @binding(5) var<storage, read> DOUT: array<u32>;
@group(0) @binding(6) var<storage, read> LSE: array<f32>;
@group(0) @binding(7) var<storage, read> MASK: array<f32>;
@group(0) @binding(8) var<storage, read_write> DELTA: array<f32>;
@group(0) @binding(9) var<storage, read_write> G1: array<atomic<u32>>;  // dq, or dk
@group(0) @binding(10) var<storage, read_write> G2: array<atomic<u32>>; // dv (dkdv only)
@group(0) @binding(11) var<storage, read> TABLE: array<u32>;

const ROWS: u32 = 64u;
// head_dim / 4 at most: what a thread holds of a row; the "wide" variant (head_dim up to 512) has 128.
const MAX_D4: u32 = 64u;
// A variant built for one head_dim ("@d128": context.cpp) fixes head_dim / 4 here (constant loop counts); 0: P.D.
const FIXED_D4: u32 = 0u;

fn ld(sel: u32, i: u32) -> f32 {
  let w = word_of(i, P.dtype);
  switch sel {
    case 0u: { return widen(Q[w], i, P.dtype); }
    case 1u: { return widen(K[w], i, P.dtype); }
    case 2u: { return widen(V[w], i, P.dtype); }
    case 3u: { return widen(OUT[w], i, P.dtype); }
    default: { return widen(DOUT[w], i, P.dtype); }
  }
}
fn ld4(sel: u32, i: u32) -> vec4<f32> {
  return vec4<f32>(ld(sel, i), ld(sel, i + 1u), ld(sel, i + 2u), ld(sel, i + 3u));
}

fn store_g1(i: u32, x: f32) {
  if (P.dtype == 0u) { atomicStore(&G1[i], bitcast<u32>(x)); return; }
  let h = half_store(i, x, P.dtype);
  atomicAnd(&G1[i >> 1u], h.x);
  atomicOr(&G1[i >> 1u], h.y);
}
fn store_g2(i: u32, x: f32) {
  if (P.dtype == 0u) { atomicStore(&G2[i], bitcast<u32>(x)); return; }
  let h = half_store(i, x, P.dtype);
  atomicAnd(&G2[i >> 1u], h.x);
  atomicOr(&G2[i >> 1u], h.y);
}

// The scaled product after the softcap (docs/spec.md §1.8), and the cap's slope there (1 without one).
fn capped(qk: f32) -> vec2<f32> {
  let x = P.scale * qk;
  if (P.softcap <= 0.0) { return vec2<f32>(x, 1.0); }
  let t = softcap_tanh(x, P.softcap);
  return vec2<f32>(P.softcap * t, 1.0 - t * t);
}

// Sequence b of the call (_sequences.wgsl): ragged [cu_seqlens_q | cu_seqlens_k | mask offsets] or the padded batch.
fn sequence_of(b: u32) -> Sequence {
  if (P.kv_layout == 1u) {
    return ragged_sequence(TABLE[b], TABLE[b + 1u], TABLE[P.B + 1u + b], TABLE[P.B + 2u + b], TABLE[2u * P.B + 2u + b],
                           P.causal_offset, P.from_end != 0u);
  }
  return Sequence(0u, P.Sq, 0u, P.Sk, P.causal_offset, b * P.m_sb);
}

// Where row `row` of sequence b, head h, has its lse and delta: [B, H, Sq], or [H, Tq] in a ragged batch.
fn stat_at(b: u32, h: u32, s: Sequence, row: u32) -> u32 {
  return select((b * P.H + h) * P.Sq + row, h * P.total_q + s.q0 + row, P.kv_layout == 1u);
}

// Element offset of row r (packed row s0 + r in a ragged batch) of a [B, S, heads, D] view.
fn row_at(b: u32, s0: u32, r: u32, head: u32, off: u32, sb: u32, ss: u32, sh: u32) -> u32 {
  return off + select(b * sb, 0u, P.kv_layout == 1u) + (s0 + r) * ss + head * sh;
}

fn score(x: f32, s: Sequence, h: u32, i: u32, j: u32) -> f32 {
  var sc = x;
  if (P.has_mask != 0u) {
    let m = MASK[P.m_off + s.mask0 + h * P.m_sh + i * P.m_sq + j * P.m_sk];
    if (m == bitcast<f32>(NEG_INF_BITS)) { return m; }  // masked whatever the key holds (NaN + -inf is NaN)
    sc += m;
  }
  return sc;
}

// exp(s - lse) is a probability: held at 1 where an lse a little below the f32 score would scale the
// gradients by exp(s - lse) (docs/spec.md §3). A NaN stays NaN.
fn probability(s: f32, lse: f32) -> f32 {
  let p = exp(s - lse);
  return select(p, 1.0, p > 1.0);
}

var<workgroup> tile_a: array<vec4<f32>, 512>;  // K (dq) or Q (dkdv) rows
var<workgroup> tile_b: array<vec4<f32>, 512>;  // V (dq) or dout (dkdv) rows
var<workgroup> tile_lse: array<f32, 64>;
var<workgroup> tile_delta: array<f32, 64>;

@compute @workgroup_size(64)
fn dq(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let d4 = select(P.D / 4u, FIXED_D4, FIXED_D4 != 0u);
  let b = (P.y0 + wid.y) / P.H;
  let h = (P.y0 + wid.y) % P.H;
  let hk = h / (P.H / P.Hkv);
  let sq = shared_sequence(sequence_of(b), lid.x);
  let n_k = sq.n_k;
  if (wid.x * ROWS >= sq.n_q) { return; }  // a shorter sequence of a ragged batch (the whole workgroup)
  let row = wid.x * ROWS + lid.x;
  let valid = row < sq.n_q;
  let bh = b * P.H + h;
  var q: array<vec4<f32>, MAX_D4>;
  var dout: array<vec4<f32>, MAX_D4>;
  var acc: array<vec4<f32>, MAX_D4>;
  var delta = 0.0;
  var lse = 0.0;
  var live = false;  // the row sees at least one key
  if (valid) {
    let q_base = row_at(b, sq.q0, row, h, P.q_off, P.q_sb, P.q_ss, P.q_sh);
    let o_base = row_at(b, sq.q0, row, h, P.o_off, P.o_sb, P.o_ss, P.o_sh);
    let do_base = row_at(b, sq.q0, row, h, P.do_off, P.do_sb, P.do_ss, P.do_sh);
    var d4acc = vec4<f32>(0.0);
    for (var c = 0u; c < d4; c++) {
      q[c] = ld4(0u, q_base + 4u * c);
      dout[c] = ld4(4u, do_base + 4u * c);
      d4acc = fma(dout[c], ld4(3u, o_base + 4u * c), d4acc);
      acc[c] = vec4<f32>(0.0);
    }
    delta = d4acc.x + d4acc.y + d4acc.z + d4acc.w;
    DELTA[stat_at(b, h, sq, row)] = delta;
    lse = LSE[P.lse_off + stat_at(b, h, sq, row)];
    live = lse > MASKED;
  }
  let pos = i32(row) + sq.offset;
  let tile = P.tile;
  for (var ks = 0u; ks < n_k; ks += tile) {
    for (var i = lid.x; i < tile * d4; i += ROWS) {
      let j = ks + i / d4;
      let c = i % d4;
      var kv = vec4<f32>(0.0);
      var vv = vec4<f32>(0.0);
      if (j < n_k) {
        kv = ld4(1u, row_at(b, sq.k0, j, hk, P.k_off, P.k_sb, P.k_ss, P.k_sh) + 4u * c);
        vv = ld4(2u, row_at(b, sq.k0, j, hk, P.v_off, P.v_sb, P.v_ss, P.v_sh) + 4u * c);
      }
      tile_a[i] = kv;
      tile_b[i] = vv;
    }
    workgroupBarrier();
    if (live) {
      for (var r = 0u; r < tile; r++) {
        let j = ks + r;
        if (!key_visible(i32(j), pos, i32(n_k), P.causal, P.window)) { continue; }
        var qk = vec4<f32>(0.0);
        var dv = vec4<f32>(0.0);
        for (var c = 0u; c < d4; c++) {
          qk = fma(q[c], tile_a[r * d4 + c], qk);
          dv = fma(dout[c], tile_b[r * d4 + c], dv);
        }
        let cs = capped(qk.x + qk.y + qk.z + qk.w);
        let s = score(cs.x, sq, h, row, j);
        if (s <= MASKED) { continue; }
        let p = probability(s, lse);
        let dp = dropout_factor(P.dropout_p, P.seed, bh, row, j) * (dv.x + dv.y + dv.z + dv.w);
        let ds = p * (dp - delta) * cs.y;
        for (var c = 0u; c < d4; c++) { acc[c] = fma(vec4<f32>(ds), tile_a[r * d4 + c], acc[c]); }
      }
    }
    workgroupBarrier();
  }
  if (valid) {
    let dq_base = row_at(b, sq.q0, row, h, P.dq_off, P.dq_sb, P.dq_ss, P.dq_sh);
    for (var c = 0u; c < d4; c++) {
      let g = acc[c] * P.scale;
      store_g1(dq_base + 4u * c, g.x);
      store_g1(dq_base + 4u * c + 1u, g.y);
      store_g1(dq_base + 4u * c + 2u, g.z);
      store_g1(dq_base + 4u * c + 3u, g.w);
    }
  }
}

@compute @workgroup_size(64)
fn dkdv(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let d4 = select(P.D / 4u, FIXED_D4, FIXED_D4 != 0u);
  let b = (P.y0 + wid.y) / P.Hkv;
  let hk = (P.y0 + wid.y) % P.Hkv;
  let group = P.H / P.Hkv;
  let sq = shared_sequence(sequence_of(b), lid.x);
  let n_q = sq.n_q;
  let n_k = sq.n_k;
  if (wid.x * ROWS >= n_k) { return; }  // a shorter sequence of a ragged batch (the whole workgroup)
  let j = wid.x * ROWS + lid.x;
  let valid = j < n_k;
  var k: array<vec4<f32>, MAX_D4>;
  var v: array<vec4<f32>, MAX_D4>;
  var dk: array<vec4<f32>, MAX_D4>;
  var dv: array<vec4<f32>, MAX_D4>;
  for (var c = 0u; c < d4; c++) {
    k[c] = vec4<f32>(0.0);
    v[c] = vec4<f32>(0.0);
    if (valid) {
      k[c] = ld4(1u, row_at(b, sq.k0, j, hk, P.k_off, P.k_sb, P.k_ss, P.k_sh) + 4u * c);
      v[c] = ld4(2u, row_at(b, sq.k0, j, hk, P.v_off, P.v_sb, P.v_ss, P.v_sh) + 4u * c);
    }
    dk[c] = vec4<f32>(0.0);
    dv[c] = vec4<f32>(0.0);
  }
  let tile = P.tile;
  for (var g = 0u; g < group; g++) {
    let h = hk * group + g;
    let bh = b * P.H + h;
    for (var is = 0u; is < n_q; is += tile) {
      for (var i = lid.x; i < tile * d4; i += ROWS) {
        let row = is + i / d4;
        let c = i % d4;
        var qv = vec4<f32>(0.0);
        var dov = vec4<f32>(0.0);
        if (row < n_q) {
          qv = ld4(0u, row_at(b, sq.q0, row, h, P.q_off, P.q_sb, P.q_ss, P.q_sh) + 4u * c);
          dov = ld4(4u, row_at(b, sq.q0, row, h, P.do_off, P.do_sb, P.do_ss, P.do_sh) + 4u * c);
        }
        tile_a[i] = qv;
        tile_b[i] = dov;
      }
      if (lid.x < tile) {
        let row = is + lid.x;
        var l = bitcast<f32>(NEG_INF_BITS);
        var dl = 0.0;
        if (row < n_q) {
          l = LSE[P.lse_off + stat_at(b, h, sq, row)];
          dl = DELTA[stat_at(b, h, sq, row)];
        }
        tile_lse[lid.x] = l;
        tile_delta[lid.x] = dl;
      }
      workgroupBarrier();
      if (valid) {
        for (var r = 0u; r < tile; r++) {
          let row = is + r;
          if (row >= n_q || tile_lse[r] <= MASKED) { continue; }
          let pos = i32(row) + sq.offset;
          if (!key_visible(i32(j), pos, i32(n_k), P.causal, P.window)) { continue; }
          var qk = vec4<f32>(0.0);
          var dov = vec4<f32>(0.0);
          for (var c = 0u; c < d4; c++) {
            qk = fma(tile_a[r * d4 + c], k[c], qk);
            dov = fma(tile_b[r * d4 + c], v[c], dov);
          }
          let cs = capped(qk.x + qk.y + qk.z + qk.w);
          let s = score(cs.x, sq, h, row, j);
          if (s <= MASKED) { continue; }
          let p = probability(s, tile_lse[r]);
          let f = dropout_factor(P.dropout_p, P.seed, bh, row, j);
          let ds = p * (f * (dov.x + dov.y + dov.z + dov.w) - tile_delta[r]) * cs.y;
          let pf = p * f;
          for (var c = 0u; c < d4; c++) {
            dv[c] = fma(vec4<f32>(pf), tile_b[r * d4 + c], dv[c]);
            dk[c] = fma(vec4<f32>(ds), tile_a[r * d4 + c], dk[c]);
          }
        }
      }
      workgroupBarrier();
    }
  }
  if (valid) {
    let dk_base = row_at(b, sq.k0, j, hk, P.dk_off, P.dk_sb, P.dk_ss, P.dk_sh);
    let dv_base = row_at(b, sq.k0, j, hk, P.dv_off, P.dv_sb, P.dv_ss, P.dv_sh);
    for (var c = 0u; c < d4; c++) {
      let gk = dk[c] * P.scale;
      let gv = dv[c];
      store_g1(dk_base + 4u * c, gk.x);
      store_g1(dk_base + 4u * c + 1u, gk.y);
      store_g1(dk_base + 4u * c + 2u, gk.z);
      store_g1(dk_base + 4u * c + 3u, gk.w);
      store_g2(dv_base + 4u * c, gv.x);
      store_g2(dv_base + 4u * c + 1u, gv.y);
      store_g2(dv_base + 4u * c + 2u, gv.z);
      store_g2(dv_base + 4u * c + 3u, gv.w);
    }
  }
}

// ---- The tiled dk/dv (entry point dkdv_tiled): 16-bit inputs at a fixed head_dim (variants "d64" and "d128"). ----
// A workgroup of 64 threads covers 16 keys of one (batch, kv head) against tiles of 32 query rows of every head of
// the group, all held in workgroup memory as their 16-bit words. Thread t holds keys 2 (t / 8) and 2 (t / 8) + 1:
// it scores them against rows t % 8 + 8 i (i < 4) (q.k and dout.v), and accumulates their dk and dv at the vec4
// columns t % 8 + 8 j (j < head_dim / 32), where the one-key-a-thread kernel held four whole rows per thread.
const B_KEYS: u32 = 16u;
const B_ROWS: u32 = 32u;
const B_D4: u32 = select(32u, FIXED_D4, FIXED_D4 != 0u);  // a variant's head_dim / 4 (the entry needs one)
const B_STRIDE: u32 = B_D4 + 1u;                           // padded rows: neighbouring rows in other banks
const B_PSTRIDE: u32 = B_ROWS + 1u;
// The dtype of a variant ("f16": 1, "bf16": 2), which the tiles' words are unpacked as; 0: P.dtype.
const FIXED_DTYPE: u32 = 0u;

var<workgroup> bk_rows: array<vec2<u32>, B_KEYS * B_STRIDE>;  // four 16-bit elements per entry
var<workgroup> bv_rows: array<vec2<u32>, B_KEYS * B_STRIDE>;
var<workgroup> bq_rows: array<vec2<u32>, B_ROWS * B_STRIDE>;
var<workgroup> bdo_rows: array<vec2<u32>, B_ROWS * B_STRIDE>;
var<workgroup> b_pf: array<f32, B_KEYS * B_PSTRIDE>;  // P f of key k and row r at [k * B_PSTRIDE + r]
var<workgroup> b_ds: array<f32, B_KEYS * B_PSTRIDE>;  // dS likewise
var<workgroup> b_lse: array<f32, B_ROWS>;
var<workgroup> b_delta: array<f32, B_ROWS>;

fn tile_dtype() -> u32 { return select(P.dtype, FIXED_DTYPE, FIXED_DTYPE != 0u); }
fn pack4(x: vec4<f32>) -> vec2<u32> { return pack4_16(x, tile_dtype()); }
fn unpack4(w: vec2<u32>) -> vec4<f32> { return unpack4_16(w, tile_dtype()); }

// Query rows [row0, row0 + B_ROWS) of head h (q and dout; zeros past the sequence) into bq_rows and bdo_rows,
// entry i of `threads` invocations at a time.
fn load_query_rows(b: u32, s: Sequence, row0: u32, h: u32, tid: u32, threads: u32) {
  for (var i = tid; i < B_ROWS * B_D4; i += threads) {
    let row = row0 + i / B_D4;
    var qv = vec4<f32>(0.0);
    var dov = vec4<f32>(0.0);
    if (row < s.n_q) {
      qv = ld4(0u, row_at(b, s.q0, row, h, P.q_off, P.q_sb, P.q_ss, P.q_sh) + 4u * (i % B_D4));
      dov = ld4(4u, row_at(b, s.q0, row, h, P.do_off, P.do_sb, P.do_ss, P.do_sh) + 4u * (i % B_D4));
    }
    bq_rows[(i / B_D4) * B_STRIDE + i % B_D4] = pack4(qv);
    bdo_rows[(i / B_D4) * B_STRIDE + i % B_D4] = pack4(dov);
  }
}

// Keys [key0, key0 + B_KEYS) of kv head hk (k and v; zeros past the sequence) into bk_rows and bv_rows.
fn load_key_rows(b: u32, s: Sequence, key0: u32, hk: u32, tid: u32, threads: u32) {
  for (var i = tid; i < B_KEYS * B_D4; i += threads) {
    let j = key0 + i / B_D4;
    var kv = vec4<f32>(0.0);
    var vv = vec4<f32>(0.0);
    if (j < s.n_k) {
      kv = ld4(1u, row_at(b, s.k0, j, hk, P.k_off, P.k_sb, P.k_ss, P.k_sh) + 4u * (i % B_D4));
      vv = ld4(2u, row_at(b, s.k0, j, hk, P.v_off, P.v_sb, P.v_ss, P.v_sh) + 4u * (i % B_D4));
    }
    bk_rows[(i / B_D4) * B_STRIDE + i % B_D4] = pack4(kv);
    bv_rows[(i / B_D4) * B_STRIDE + i % B_D4] = pack4(vv);
  }
}

// The query rows [x, y) of sequence `s` that any of keys [key0, key_end) can see (causal, window).
fn visible_rows(s: Sequence, key0: u32, key_end: u32) -> vec2<u32> {
  var lo = 0;
  var hi = i32(s.n_q);
  if (P.causal != 0u) { lo = max(lo, i32(key0) - s.offset); }  // a row sees key j from position j on
  if (P.window > 0) {
    hi = min(hi, i32(key_end) - 1 + P.window - s.offset);  // positions up to the last key + window - 1
    if (P.causal == 0u) { lo = max(lo, i32(key0) - P.window + 1 - s.offset); }
  }
  return vec2<u32>(u32(clamp(lo, 0, i32(s.n_q))), u32(clamp(hi, 0, i32(s.n_q))));
}

@compute @workgroup_size(64)
fn dkdv_tiled(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let t = lid.x;
  let kp = t / 8u;
  let rx = t % 8u;
  let b = (P.y0 + wid.y) / P.Hkv;
  let hk = (P.y0 + wid.y) % P.Hkv;
  let group = P.H / P.Hkv;
  let sq = shared_sequence(sequence_of(b), t);
  let n_q = sq.n_q;
  let n_k = sq.n_k;
  let key0 = wid.x * B_KEYS;
  if (key0 >= n_k) { return; }  // a shorter sequence of a ragged batch (uniform: the whole workgroup)
  load_key_rows(b, sq, key0, hk, t, 64u);
  var keys = array<u32, 2>(key0 + 2u * kp, key0 + 2u * kp + 1u);
  var dk: array<vec4<f32>, 2 * B_D4 / 8u>;  // key k's column group j at [k * B_D4 / 8 + j]
  var dv: array<vec4<f32>, 2 * B_D4 / 8u>;
  for (var j = 0u; j < 2u * B_D4 / 8u; j++) {
    dk[j] = vec4<f32>(0.0);
    dv[j] = vec4<f32>(0.0);
  }
  let rows = visible_rows(sq, key0, min(key0 + B_KEYS, n_k));
  for (var g = 0u; g < group; g++) {
    let h = hk * group + g;
    let bh = b * P.H + h;
    for (var is = rows.x; is < rows.y; is += B_ROWS) {
      load_query_rows(b, sq, is, h, t, 64u);
      if (t < B_ROWS) {
        var l = bitcast<f32>(NEG_INF_BITS);
        var dl = 0.0;
        if (is + t < n_q) {
          l = LSE[P.lse_off + stat_at(b, h, sq, is + t)];
          dl = DELTA[stat_at(b, h, sq, is + t)];
        }
        b_lse[t] = l;
        b_delta[t] = dl;
      }
      workgroupBarrier();
      // q.k and dout.v of keys (2 kp, 2 kp + 1) and rows rx + 8 i.
      var qk: array<vec4<f32>, 8>;   // [k * 4 + i]
      var dov: array<vec4<f32>, 8>;
      for (var x = 0u; x < 8u; x++) {
        qk[x] = vec4<f32>(0.0);
        dov[x] = vec4<f32>(0.0);
      }
      for (var c = 0u; c < B_D4; c++) {
        let ka = unpack4(bk_rows[(2u * kp) * B_STRIDE + c]);
        let kb = unpack4(bk_rows[(2u * kp + 1u) * B_STRIDE + c]);
        let va = unpack4(bv_rows[(2u * kp) * B_STRIDE + c]);
        let vb = unpack4(bv_rows[(2u * kp + 1u) * B_STRIDE + c]);
        for (var i = 0u; i < 4u; i++) {
          let qv = unpack4(bq_rows[(rx + 8u * i) * B_STRIDE + c]);
          let dv_row = unpack4(bdo_rows[(rx + 8u * i) * B_STRIDE + c]);
          qk[i] = fma(qv, ka, qk[i]);
          qk[4u + i] = fma(qv, kb, qk[4u + i]);
          dov[i] = fma(dv_row, va, dov[i]);
          dov[4u + i] = fma(dv_row, vb, dov[4u + i]);
        }
      }
      for (var k = 0u; k < 2u; k++) {
        let j = keys[k];
        for (var i = 0u; i < 4u; i++) {
          let r = rx + 8u * i;
          let row = is + r;
          var pf = 0.0;
          var ds = 0.0;
          if (row < n_q && j < n_k && b_lse[r] > MASKED &&
              key_visible(i32(j), i32(row) + sq.offset, i32(n_k), P.causal, P.window)) {
            let d = qk[k * 4u + i];
            let cs = capped(d.x + d.y + d.z + d.w);
            let s = score(cs.x, sq, h, row, j);
            if (s > MASKED) {
              let p = probability(s, b_lse[r]);
              let f = dropout_factor(P.dropout_p, P.seed, bh, row, j);
              let e = dov[k * 4u + i];
              ds = p * (f * (e.x + e.y + e.z + e.w) - b_delta[r]) * cs.y;
              pf = p * f;
            }
          }
          b_pf[(2u * kp + k) * B_PSTRIDE + r] = pf;
          b_ds[(2u * kp + k) * B_PSTRIDE + r] = ds;
        }
      }
      workgroupBarrier();
      // dv += P f dout and dk += dS q over the tile's rows, at column groups rx + 8 j; a row of weight 0 adds
      // nothing, whatever it holds (0 times inf is NaN).
      for (var r = 0u; r < B_ROWS; r++) {
        var w_pf = array<f32, 2>(b_pf[(2u * kp) * B_PSTRIDE + r], b_pf[(2u * kp + 1u) * B_PSTRIDE + r]);
        var w_ds = array<f32, 2>(b_ds[(2u * kp) * B_PSTRIDE + r], b_ds[(2u * kp + 1u) * B_PSTRIDE + r]);
        if (w_pf[0] == 0.0 && w_pf[1] == 0.0 && w_ds[0] == 0.0 && w_ds[1] == 0.0) { continue; }
        for (var j = 0u; j < B_D4 / 8u; j++) {
          let do_c = unpack4(bdo_rows[r * B_STRIDE + rx + 8u * j]);
          let q_c = unpack4(bq_rows[r * B_STRIDE + rx + 8u * j]);
          for (var k = 0u; k < 2u; k++) {
            if (w_pf[k] != 0.0) { dv[k * B_D4 / 8u + j] = fma(vec4<f32>(w_pf[k]), do_c, dv[k * B_D4 / 8u + j]); }
            if (w_ds[k] != 0.0) { dk[k * B_D4 / 8u + j] = fma(vec4<f32>(w_ds[k]), q_c, dk[k * B_D4 / 8u + j]); }
          }
        }
      }
      workgroupBarrier();
    }
  }
  for (var k = 0u; k < 2u; k++) {
    let j = keys[k];
    if (j >= n_k) { continue; }
    let dk_base = row_at(b, sq.k0, j, hk, P.dk_off, P.dk_sb, P.dk_ss, P.dk_sh);
    let dv_base = row_at(b, sq.k0, j, hk, P.dv_off, P.dv_sb, P.dv_ss, P.dv_sh);
    for (var x = 0u; x < B_D4 / 8u; x++) {
      let c = 4u * (rx + 8u * x);
      let gk = dk[k * B_D4 / 8u + x] * P.scale;
      let gv = dv[k * B_D4 / 8u + x];
      store_g1(dk_base + c, gk.x);
      store_g1(dk_base + c + 1u, gk.y);
      store_g1(dk_base + c + 2u, gk.z);
      store_g1(dk_base + c + 3u, gk.w);
      store_g2(dv_base + c, gv.x);
      store_g2(dv_base + c + 1u, gv.y);
      store_g2(dv_base + c + 2u, gv.z);
      store_g2(dv_base + c + 3u, gv.w);
    }
  }
}

// The tiled dq (entry point dq_tiled), for the same inputs as dkdv_tiled and with its workgroup memory: 128 threads
// cover 32 query rows of one (batch, head) against tiles of 16 keys. Thread t holds rows 2 (t / 8) and
// 2 (t / 8) + 1: it scores them against keys t % 8 and t % 8 + 8 (q.k and dout.v), and accumulates their dq at the
// vec4 columns t % 8 + 8 j. Threads 0-31 first write each row's delta = <dout, out> (for dkdv and the sinks).
@compute @workgroup_size(128)
fn dq_tiled(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let t = lid.x;
  let ty = t / 8u;
  let tx = t % 8u;
  let b = (P.y0 + wid.y) / P.H;
  let h = (P.y0 + wid.y) % P.H;
  let hk = h / (P.H / P.Hkv);
  let sq = shared_sequence(sequence_of(b), t);
  let n_q = sq.n_q;
  let n_k = sq.n_k;
  let row0 = wid.x * B_ROWS;
  if (row0 >= n_q) { return; }  // a shorter sequence of a ragged batch (uniform: the whole workgroup)
  let bh = b * P.H + h;
  load_query_rows(b, sq, row0, h, t, 128u);
  if (t < B_ROWS) {
    let row = row0 + t;
    var dl = 0.0;
    var l = bitcast<f32>(NEG_INF_BITS);
    if (row < n_q) {
      let o_base = row_at(b, sq.q0, row, h, P.o_off, P.o_sb, P.o_ss, P.o_sh);
      let do_base = row_at(b, sq.q0, row, h, P.do_off, P.do_sb, P.do_ss, P.do_sh);
      var d4acc = vec4<f32>(0.0);
      for (var c = 0u; c < B_D4; c++) { d4acc = fma(ld4(4u, do_base + 4u * c), ld4(3u, o_base + 4u * c), d4acc); }
      dl = d4acc.x + d4acc.y + d4acc.z + d4acc.w;
      DELTA[stat_at(b, h, sq, row)] = dl;
      l = LSE[P.lse_off + stat_at(b, h, sq, row)];
    }
    b_delta[t] = dl;
    b_lse[t] = l;
  }
  var acc: array<vec4<f32>, 2 * B_D4 / 8u>;  // row r's column group j at [r * B_D4 / 8 + j]
  for (var j = 0u; j < 2u * B_D4 / 8u; j++) { acc[j] = vec4<f32>(0.0); }
  let bounds = visible_key_range(sq, row0, B_ROWS, P.causal, P.window);
  for (var ks = bounds.x; ks < bounds.y; ks += i32(B_KEYS)) {
    load_key_rows(b, sq, u32(ks), hk, t, 128u);
    workgroupBarrier();
    // q.k and dout.v of rows (2 ty, 2 ty + 1) and keys (tx, tx + 8).
    var qk: array<vec4<f32>, 4>;  // [r * 2 + k]
    var dp: array<vec4<f32>, 4>;
    for (var x = 0u; x < 4u; x++) {
      qk[x] = vec4<f32>(0.0);
      dp[x] = vec4<f32>(0.0);
    }
    for (var c = 0u; c < B_D4; c++) {
      let qa = unpack4(bq_rows[(2u * ty) * B_STRIDE + c]);
      let qb = unpack4(bq_rows[(2u * ty + 1u) * B_STRIDE + c]);
      let da = unpack4(bdo_rows[(2u * ty) * B_STRIDE + c]);
      let db = unpack4(bdo_rows[(2u * ty + 1u) * B_STRIDE + c]);
      for (var k = 0u; k < 2u; k++) {
        let kv = unpack4(bk_rows[(tx + 8u * k) * B_STRIDE + c]);
        let vv = unpack4(bv_rows[(tx + 8u * k) * B_STRIDE + c]);
        qk[k] = fma(qa, kv, qk[k]);
        qk[2u + k] = fma(qb, kv, qk[2u + k]);
        dp[k] = fma(da, vv, dp[k]);
        dp[2u + k] = fma(db, vv, dp[2u + k]);
      }
    }
    for (var r = 0u; r < 2u; r++) {
      let row = row0 + 2u * ty + r;
      for (var k = 0u; k < 2u; k++) {
        let j = ks + i32(tx + 8u * k);
        var ds = 0.0;
        if (row < n_q && j < i32(n_k) && b_lse[2u * ty + r] > MASKED &&
            key_visible(j, i32(row) + sq.offset, i32(n_k), P.causal, P.window)) {
          let d = qk[r * 2u + k];
          let cs = capped(d.x + d.y + d.z + d.w);
          let s = score(cs.x, sq, h, row, u32(j));
          if (s > MASKED) {
            let p = probability(s, b_lse[2u * ty + r]);
            let f = dropout_factor(P.dropout_p, P.seed, bh, row, u32(j));
            let e = dp[r * 2u + k];
            ds = p * (f * (e.x + e.y + e.z + e.w) - b_delta[2u * ty + r]) * cs.y;
          }
        }
        b_ds[(tx + 8u * k) * B_PSTRIDE + 2u * ty + r] = ds;
      }
    }
    workgroupBarrier();
    // dq += dS k over the tile's keys at column groups tx + 8 j; a key of weight 0 adds nothing (0 times inf).
    for (var k = 0u; k < B_KEYS; k++) {
      let wa = b_ds[k * B_PSTRIDE + 2u * ty];
      let wb = b_ds[k * B_PSTRIDE + 2u * ty + 1u];
      if (wa == 0.0 && wb == 0.0) { continue; }
      for (var j = 0u; j < B_D4 / 8u; j++) {
        let kv = unpack4(bk_rows[k * B_STRIDE + tx + 8u * j]);
        if (wa != 0.0) { acc[j] = fma(vec4<f32>(wa), kv, acc[j]); }
        if (wb != 0.0) { acc[B_D4 / 8u + j] = fma(vec4<f32>(wb), kv, acc[B_D4 / 8u + j]); }
      }
    }
    workgroupBarrier();
  }
  for (var r = 0u; r < 2u; r++) {
    let row = row0 + 2u * ty + r;
    if (row >= n_q) { continue; }
    let dq_base = row_at(b, sq.q0, row, h, P.dq_off, P.dq_sb, P.dq_ss, P.dq_sh);
    for (var x = 0u; x < B_D4 / 8u; x++) {
      let c = 4u * (tx + 8u * x);
      let g = acc[r * B_D4 / 8u + x] * P.scale;
      store_g1(dq_base + c, g.x);
      store_g1(dq_base + c + 1u, g.y);
      store_g1(dq_base + c + 2u, g.z);
      store_g1(dq_base + c + 3u, g.w);
    }
  }
}
