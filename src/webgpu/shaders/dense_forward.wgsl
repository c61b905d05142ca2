// Dense attention forward (docs/spec.md §1), after the seed 000: one invocation per query row; a workgroup
// covers 64 rows of one (batch, head) and streams K/V through workgroup memory a tile of keys at a
// time, with a running max and sum (online softmax). Strided views, GQA, causal with offset,
// window, additive mask with broadcast strides, dropout by hash3, LSE, softcap and attention sinks;
// ragged batches (§1.6) and paged keys (§1.7) through the sequence table (TABLE, P.kv_layout).

struct Params {
  B: u32, Sq: u32, Sk: u32, H: u32,
  Hkv: u32, D: u32, dtype: u32, causal: u32,
  scale: f32, causal_offset: i32, window: i32, has_mask: u32,
  dropout_p: f32, seed: u32, has_lse: u32, tile_k: u32,
  q_off: u32, q_sb: u32, q_ss: u32, q_sh: u32,
  k_off: u32, k_sb: u32, k_ss: u32, k_sh: u32,
  v_off: u32, v_sb: u32, v_ss: u32, v_sh: u32,
  o_off: u32, o_sb: u32, o_ss: u32, o_sh: u32,
  m_off: u32, m_sb: u32, m_sh: u32, m_sq: u32,
  m_sk: u32, lse_off: u32, softcap: f32, has_sinks: u32,
  sinks_off: u32, y0: u32,  // y0: first (batch, head) of this dispatch
  // The sequence table (webgpu/backend.cpp's SequenceTable): layout 0 padded, 1 ragged, 2 paged.
  kv_layout: u32, from_end: u32, page_size: u32, max_pages: u32,
  total_q: u32,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> Q: array<u32>;
@group(0) @binding(2) var<storage, read> K: array<u32>;
@group(0) @binding(3) var<storage, read> V: array<u32>;
@group(0) @binding(4) var<storage, read> MASK: array<f32>;
@group(0) @binding(5) var<storage, read_write> OUT: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read_write> LSE: array<f32>;
@group(0) @binding(7) var<storage, read> SINKS: array<f32>;
@group(0) @binding(8) var<storage, read> TABLE: array<u32>;

const ROWS: u32 = 64u;
// head_dim / 4 at most: what a thread holds of a row; the "wide" variant (head_dim up to 512) has 128.
const MAX_D4: u32 = 64u;
// A variant built for one head_dim ("@d128": context.cpp) fixes head_dim / 4 and the keys per tile here, so that
// the loops over a row have a constant count (unrolled, the row arrays held in registers); 0: read from P.
const FIXED_D4: u32 = 0u;
const FIXED_TILE: u32 = 0u;
// Scores are computed in units of 2^64 (q is scaled by 2^-64, exactly), so that scores past f32's range
// (up to 2^64 times it) still give the oracle's softmax (docs/spec.md §3): a power of two changes no
// rounding, and only products below 2^-62 lose bits (to subnormals or flushing), far below f32's
// rounding of any score they join.
const UNIT: f32 = 0x1p-64f;
const PER_UNIT: f32 = 0x1p64f;
const MASKED_UNITS: f32 = MASKED * UNIT;

fn ld4_q(i: u32) -> vec4<f32> {
  return vec4<f32>(widen(Q[word_of(i, P.dtype)], i, P.dtype), widen(Q[word_of(i + 1u, P.dtype)], i + 1u, P.dtype),
                   widen(Q[word_of(i + 2u, P.dtype)], i + 2u, P.dtype), widen(Q[word_of(i + 3u, P.dtype)], i + 3u, P.dtype));
}
fn ld4_k(i: u32) -> vec4<f32> {
  return vec4<f32>(widen(K[word_of(i, P.dtype)], i, P.dtype), widen(K[word_of(i + 1u, P.dtype)], i + 1u, P.dtype),
                   widen(K[word_of(i + 2u, P.dtype)], i + 2u, P.dtype), widen(K[word_of(i + 3u, P.dtype)], i + 3u, P.dtype));
}
fn ld4_v(i: u32) -> vec4<f32> {
  return vec4<f32>(widen(V[word_of(i, P.dtype)], i, P.dtype), widen(V[word_of(i + 1u, P.dtype)], i + 1u, P.dtype),
                   widen(V[word_of(i + 2u, P.dtype)], i + 2u, P.dtype), widen(V[word_of(i + 3u, P.dtype)], i + 3u, P.dtype));
}

// 16-bit outputs share words between neighbours (possibly of different rows): see half_store.
fn store_out(i: u32, x: f32) {
  if (P.dtype == 0u) {
    atomicStore(&OUT[i], bitcast<u32>(x));
    return;
  }
  let h = half_store(i, x, P.dtype);
  atomicAnd(&OUT[i >> 1u], h.x);
  atomicOr(&OUT[i >> 1u], h.y);
}

var<workgroup> k_tile: array<vec4<f32>, 512>;  // tile_k keys x D / 4
var<workgroup> v_tile: array<vec4<f32>, 512>;

// Sequence b of the call (_sequences.wgsl) from the table: ragged [cu_seqlens_q | cu_seqlens_k | mask offsets],
// paged [page_table | seq_lens_k] (lengths clamped to the table's reach), or the padded batch.
fn sequence_of(b: u32) -> Sequence {
  if (P.kv_layout == 1u) {
    return ragged_sequence(TABLE[b], TABLE[b + 1u], TABLE[P.B + 1u + b], TABLE[P.B + 2u + b], TABLE[2u * P.B + 2u + b],
                           P.causal_offset, P.from_end != 0u);
  }
  if (P.kv_layout == 2u) {
    let n_k = u32(clamp(i32(TABLE[P.B * P.max_pages + b]), 0, i32(P.Sk)));
    let offset = select(P.causal_offset, i32(n_k) - i32(P.Sq), P.from_end != 0u);
    return Sequence(0u, P.Sq, 0u, n_k, offset, b * P.m_sb);
  }
  return Sequence(0u, P.Sq, 0u, P.Sk, P.causal_offset, b * P.m_sb);
}

// Element offset of key j's row (kv head hk) in K or V, given the view's offset and strides.
fn key_row(b: u32, s: Sequence, j: u32, hk: u32, off: u32, sb: u32, ss: u32, sh: u32) -> u32 {
  if (P.kv_layout == 2u) {
    let page = TABLE[b * P.max_pages + j / P.page_size];  // checked on the host
    return off + page * sb + (j % P.page_size) * ss + hk * sh;
  }
  return off + select(b * sb, 0u, P.kv_layout == 1u) + (s.k0 + j) * ss + hk * sh;
}

fn visible_keys(s: Sequence, row0: u32, rows: u32) -> vec2<i32> {
  return visible_key_range(s, row0, rows, P.causal, P.window);
}

// The score of visible key j for the row whose mask row starts at `m_base`, in units, from q.k in units: scaled,
// capped and masked (MASKED_UNITS where the mask is -inf). Callers check visibility before the product.
fn score_units(dot: f32, j: i32, m_base: u32) -> f32 {
  var sc = P.scale * dot;
  if (P.softcap > 0.0) { sc = P.softcap * softcap_tanh(sc * PER_UNIT, P.softcap) * UNIT; }
  if (P.has_mask != 0u) {
    let m = MASK[m_base + u32(j) * P.m_sk];
    // masked whatever the key holds (NaN + -inf is NaN)
    sc = select(sc + m * UNIT, MASKED_UNITS, m == bitcast<f32>(NEG_INF_BITS));
  }
  return sc;
}

// Row `row` of (b, h) done: the head's sink logit (docs/spec.md §1.9; -inf is none) joins the maximum and the
// denominator with no value, then out = acc / l (acc holds d4 vec4, the caller's row of them) and the LSE.
fn sink_scale(h: u32, m_run: ptr<function, f32>, l_run: ptr<function, f32>) -> f32 {
  var o_scale = 1.0;
  if (P.has_sinks != 0u) {
    let sink = SINKS[P.sinks_off + h] * UNIT;
    if (sink > bitcast<f32>(NEG_INF_BITS)) {
      let m_new = max(*m_run, sink);
      o_scale = select(exp((*m_run - m_new) * PER_UNIT), 0.0, *l_run == 0.0);
      *l_run = *l_run * o_scale + exp((sink - m_new) * PER_UNIT);
      *m_run = m_new;
    }
  }
  return o_scale;
}

fn store_out4(at: u32, o: vec4<f32>) {
  store_out(at, o.x);
  store_out(at + 1u, o.y);
  store_out(at + 2u, o.z);
  store_out(at + 3u, o.w);
}

fn store_lse(b: u32, h: u32, s: Sequence, row: u32, m_run: f32, l_run: f32) {
  if (P.has_lse == 0u) { return; }
  // [B, H, Sq], or [H, Tq] in a ragged batch
  let at = select((b * P.H + h) * P.Sq + row, h * P.total_q + s.q0 + row, P.kv_layout == 1u);
  LSE[P.lse_off + at] = select(bitcast<f32>(NEG_INF_BITS), m_run * PER_UNIT + log(l_run), l_run > 0.0);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let d4 = select(P.D / 4u, FIXED_D4, FIXED_D4 != 0u);
  let b = (P.y0 + wid.y) / P.H;
  let h = (P.y0 + wid.y) % P.H;
  let hk = h / (P.H / P.Hkv);
  let sq = shared_sequence(sequence_of(b), lid.x);
  let n_q = sq.n_q;
  let n_k = sq.n_k;
  let row0 = wid.x * ROWS;
  if (row0 >= n_q) { return; }  // a shorter sequence of a ragged batch (uniform: the whole workgroup)
  let row = row0 + lid.x;
  let valid = row < n_q;
  var q: array<vec4<f32>, MAX_D4>;
  var acc: array<vec4<f32>, MAX_D4>;
  let b_q = select(b, 0u, P.kv_layout == 1u);  // a ragged batch's rows are packed along dimension 1
  let q_base = P.q_off + b_q * P.q_sb + (sq.q0 + row) * P.q_ss + h * P.q_sh;
  for (var c = 0u; c < d4; c++) {
    acc[c] = vec4<f32>(0.0);
    q[c] = vec4<f32>(0.0);
    if (valid) { q[c] = ld4_q(q_base + 4u * c) * UNIT; }
  }
  let pos = i32(row) + sq.offset;
  let bounds = visible_keys(sq, row0, ROWS);
  let k_begin = bounds.x;
  let k_end = bounds.y;
  let bh = b * P.H + h;
  let m_base = P.m_off + sq.mask0 + h * P.m_sh + row * P.m_sq;
  var m_run = MASKED_UNITS;
  var l_run = 0.0;
  let tile_k = i32(select(P.tile_k, FIXED_TILE, FIXED_TILE != 0u));
  for (var ks = k_begin; ks < k_end; ks += tile_k) {
    for (var i = lid.x; i < u32(tile_k) * d4; i += ROWS) {
      let r = i / d4;
      let c = i % d4;
      let j = u32(ks) + r;
      var kv = vec4<f32>(0.0);
      var vv = vec4<f32>(0.0);
      if (j < n_k) {
        kv = ld4_k(key_row(b, sq, j, hk, P.k_off, P.k_sb, P.k_ss, P.k_sh) + 4u * c);
        vv = ld4_v(key_row(b, sq, j, hk, P.v_off, P.v_sb, P.v_ss, P.v_sh) + 4u * c);
      }
      k_tile[i] = kv;
      v_tile[i] = vv;
    }
    workgroupBarrier();
    if (valid) {
      var s: array<f32, 64>;
      var tile_max = MASKED_UNITS;
      for (var r = 0; r < tile_k; r++) {
        let j = ks + r;
        var sc = MASKED_UNITS;
        if (key_visible(j, pos, i32(n_k), P.causal, P.window)) {
          var dot4 = vec4<f32>(0.0);
          for (var c = 0u; c < d4; c++) { dot4 = fma(q[c], k_tile[u32(r) * d4 + c], dot4); }
          sc = score_units(dot4.x + dot4.y + dot4.z + dot4.w, j, m_base);
        }
        s[r] = sc;
        tile_max = max(tile_max, sc);
      }
      if (tile_max > MASKED_UNITS) {
        let m_new = max(m_run, tile_max);
        let corr = exp((m_run - m_new) * PER_UNIT);
        l_run *= corr;
        for (var c = 0u; c < d4; c++) { acc[c] *= corr; }
        for (var r = 0; r < tile_k; r++) {
          if (s[r] > MASKED_UNITS) {
            let p = exp((s[r] - m_new) * PER_UNIT);
            l_run += p;
            let w = p * dropout_factor(P.dropout_p, P.seed, bh, row, u32(ks + r));
            if (w != 0.0) {
              for (var c = 0u; c < d4; c++) { acc[c] = fma(vec4<f32>(w), v_tile[u32(r) * d4 + c], acc[c]); }
            }
          }
        }
        m_run = m_new;
      }
    }
    workgroupBarrier();
  }
  if (valid) {
    var m_fin = m_run;
    var l_fin = l_run;
    let o_scale = sink_scale(h, &m_fin, &l_fin);
    let inv = select(0.0, o_scale / l_fin, l_fin > 0.0);
    let o_base = P.o_off + b_q * P.o_sb + (sq.q0 + row) * P.o_ss + h * P.o_sh;
    for (var c = 0u; c < d4; c++) { store_out4(o_base + 4u * c, acc[c] * inv); }
    store_lse(b, h, sq, row, m_fin, l_fin);
  }
}

// ---- The tiled forward (entry point `tiled`): 16-bit inputs at a fixed head_dim (variants "d64" and "d128"). ----
// A workgroup of 128 threads covers 32 query rows of one (batch, head) against tiles of 32 keys, all held in
// workgroup memory as their 16-bit words (exact: the elements as stored). Thread t holds rows 2 (t / 8) and
// 2 (t / 8) + 1: it scores them against keys t % 8 + 8 i (i < 4), and accumulates their outputs at the vec4
// columns t % 8 + 8 j (j < head_dim / 32): each vec4 it reads feeds 8 or 16 multiply-adds instead of 4.
// The rows' maxima are shared through workgroup memory once a tile; the sums stay per thread until the end.
const T_ROWS: u32 = 32u;
const T_KEYS: u32 = 32u;
const T_D4: u32 = select(32u, FIXED_D4, FIXED_D4 != 0u);  // a variant's head_dim / 4 (the entry needs one)
const T_STRIDE: u32 = T_D4 + 1u;                           // padded rows: neighbouring rows in other banks
const T_PSTRIDE: u32 = T_KEYS + 1u;
// The dtype of a variant ("f16": 1, "bf16": 2), which the tiles' words are unpacked as; 0: P.dtype.
const FIXED_DTYPE: u32 = 0u;

var<workgroup> tq_rows: array<vec2<u32>, T_ROWS * T_STRIDE>;  // four 16-bit elements per entry
var<workgroup> tk_rows: array<vec2<u32>, T_KEYS * T_STRIDE>;
var<workgroup> tv_rows: array<vec2<u32>, T_KEYS * T_STRIDE>;
var<workgroup> t_weights: array<f32, T_ROWS * T_PSTRIDE>;     // p times the dropout factor
var<workgroup> t_row_max: array<f32, T_ROWS * 8u>;            // each thread's maxima, then its sums

fn tile_dtype() -> u32 { return select(P.dtype, FIXED_DTYPE, FIXED_DTYPE != 0u); }
fn pack4(x: vec4<f32>) -> vec2<u32> { return pack4_16(x, tile_dtype()); }
fn unpack4(w: vec2<u32>) -> vec4<f32> { return unpack4_16(w, tile_dtype()); }

@compute @workgroup_size(128)
fn tiled(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let t = lid.x;
  let ty = t / 8u;
  let tx = t % 8u;
  let b = (P.y0 + wid.y) / P.H;
  let h = (P.y0 + wid.y) % P.H;
  let hk = h / (P.H / P.Hkv);
  let sq = shared_sequence(sequence_of(b), t);
  let n_q = sq.n_q;
  let n_k = sq.n_k;
  let row0 = wid.x * T_ROWS;
  if (row0 >= n_q) { return; }  // a shorter sequence of a ragged batch (uniform: the whole workgroup)
  let b_q = select(b, 0u, P.kv_layout == 1u);  // a ragged batch's rows are packed along dimension 1
  for (var i = t; i < T_ROWS * T_D4; i += 128u) {
    let r = i / T_D4;
    var x = vec4<f32>(0.0);
    if (row0 + r < n_q) { x = ld4_q(P.q_off + b_q * P.q_sb + (sq.q0 + row0 + r) * P.q_ss + h * P.q_sh + 4u * (i % T_D4)); }
    tq_rows[r * T_STRIDE + i % T_D4] = pack4(x);
  }
  let bounds = visible_keys(sq, row0, T_ROWS);
  let bh = b * P.H + h;
  var rows = array<u32, 2>(row0 + 2u * ty, row0 + 2u * ty + 1u);
  var m_run = array<f32, 2>(MASKED_UNITS, MASKED_UNITS);
  var l_part = array<f32, 2>(0.0, 0.0);  // this thread's keys' share of each row's sum
  var acc: array<vec4<f32>, 2 * T_D4 / 8u>;  // row r's column group j at [r * T_D4 / 8 + j]
  for (var j = 0u; j < 2u * T_D4 / 8u; j++) { acc[j] = vec4<f32>(0.0); }
  for (var ks = bounds.x; ks < bounds.y; ks += i32(T_KEYS)) {
    for (var i = t; i < T_KEYS * T_D4; i += 128u) {
      let j = u32(ks) + i / T_D4;
      var kv = vec4<f32>(0.0);
      var vv = vec4<f32>(0.0);
      if (j < n_k) {
        kv = ld4_k(key_row(b, sq, j, hk, P.k_off, P.k_sb, P.k_ss, P.k_sh) + 4u * (i % T_D4));
        vv = ld4_v(key_row(b, sq, j, hk, P.v_off, P.v_sb, P.v_ss, P.v_sh) + 4u * (i % T_D4));
      }
      tk_rows[(i / T_D4) * T_STRIDE + i % T_D4] = pack4(kv);
      tv_rows[(i / T_D4) * T_STRIDE + i % T_D4] = pack4(vv);
    }
    workgroupBarrier();
    // Scores of rows (2 ty, 2 ty + 1) against keys tx + 8 i.
    var dots: array<vec4<f32>, 8>;  // [r * 4 + i]
    for (var k = 0u; k < 8u; k++) { dots[k] = vec4<f32>(0.0); }
    for (var c = 0u; c < T_D4; c++) {
      let qa = unpack4(tq_rows[(2u * ty) * T_STRIDE + c]) * UNIT;
      let qb = unpack4(tq_rows[(2u * ty + 1u) * T_STRIDE + c]) * UNIT;
      for (var i = 0u; i < 4u; i++) {
        let kv = unpack4(tk_rows[(tx + 8u * i) * T_STRIDE + c]);
        dots[i] = fma(qa, kv, dots[i]);
        dots[4u + i] = fma(qb, kv, dots[4u + i]);
      }
    }
    var s: array<f32, 8>;
    var tile_maxes: array<f32, 2>;
    for (var r = 0u; r < 2u; r++) {
      let pos = i32(rows[r]) + sq.offset;
      let m_base = P.m_off + sq.mask0 + h * P.m_sh + rows[r] * P.m_sq;
      var local_max = MASKED_UNITS;
      for (var i = 0u; i < 4u; i++) {
        let d = dots[r * 4u + i];
        var sc = MASKED_UNITS;
        let j = ks + i32(tx + 8u * i);
        if (rows[r] < n_q && key_visible(j, pos, i32(n_k), P.causal, P.window)) {
          sc = score_units(d.x + d.y + d.z + d.w, j, m_base);
        }
        s[r * 4u + i] = sc;
        local_max = max(local_max, sc);
      }
      tile_maxes[r] = local_max;
    }
    // Each row's maximum over its eight threads (lanes tx of one subgroup, or through workgroup memory).
    // #if subgroups
    for (var r = 0u; r < 2u; r++) {
      for (var lanes = 4u; lanes > 0u; lanes >>= 1u) {
        tile_maxes[r] = max(tile_maxes[r], subgroupShuffleXor(tile_maxes[r], lanes));
      }
    }
    // #else
    for (var r = 0u; r < 2u; r++) { t_row_max[(2u * ty + r) * 8u + tx] = tile_maxes[r]; }
    workgroupBarrier();
    for (var r = 0u; r < 2u; r++) {
      for (var x = 0u; x < 8u; x++) { tile_maxes[r] = max(tile_maxes[r], t_row_max[(2u * ty + r) * 8u + x]); }
    }
    // #endif
    for (var r = 0u; r < 2u; r++) {
      let tile_max = tile_maxes[r];
      var corr = 1.0;
      var m_new = m_run[r];
      if (tile_max > MASKED_UNITS) {
        m_new = max(m_run[r], tile_max);
        corr = exp((m_run[r] - m_new) * PER_UNIT);
        m_run[r] = m_new;
      }
      var sum = 0.0;
      for (var i = 0u; i < 4u; i++) {
        var w = 0.0;
        if (s[r * 4u + i] > MASKED_UNITS) {
          let p = exp((s[r * 4u + i] - m_new) * PER_UNIT);
          sum += p;
          w = p * dropout_factor(P.dropout_p, P.seed, bh, rows[r], u32(ks) + tx + 8u * i);
        }
        t_weights[(2u * ty + r) * T_PSTRIDE + tx + 8u * i] = w;
      }
      l_part[r] = l_part[r] * corr + sum;
      for (var j = 0u; j < T_D4 / 8u; j++) { acc[r * T_D4 / 8u + j] *= corr; }
    }
    workgroupBarrier();
    // Outputs of the two rows at column groups tx + 8 j; a key of weight 0 (hidden, masked or dropped) adds
    // nothing, whatever its value holds (0 times inf is NaN).
    for (var k = 0u; k < T_KEYS; k++) {
      let wa = t_weights[(2u * ty) * T_PSTRIDE + k];
      let wb = t_weights[(2u * ty + 1u) * T_PSTRIDE + k];
      var vv: array<vec4<f32>, T_D4 / 8u>;
      for (var j = 0u; j < T_D4 / 8u; j++) { vv[j] = unpack4(tv_rows[k * T_STRIDE + tx + 8u * j]); }
      if (wa != 0.0) {
        for (var j = 0u; j < T_D4 / 8u; j++) { acc[j] = fma(vec4<f32>(wa), vv[j], acc[j]); }
      }
      if (wb != 0.0) {
        for (var j = 0u; j < T_D4 / 8u; j++) { acc[T_D4 / 8u + j] = fma(vec4<f32>(wb), vv[j], acc[T_D4 / 8u + j]); }
      }
    }
    workgroupBarrier();
  }
  // The rows' sums: the eight threads' shares of each added up.
  var l_sums: array<f32, 2>;
  // #if subgroups
  for (var r = 0u; r < 2u; r++) {
    l_sums[r] = l_part[r];
    for (var lanes = 4u; lanes > 0u; lanes >>= 1u) { l_sums[r] += subgroupShuffleXor(l_sums[r], lanes); }
  }
  // #else
  for (var r = 0u; r < 2u; r++) { t_row_max[(2u * ty + r) * 8u + tx] = l_part[r]; }
  workgroupBarrier();
  for (var r = 0u; r < 2u; r++) {
    l_sums[r] = 0.0;
    for (var x = 0u; x < 8u; x++) { l_sums[r] += t_row_max[(2u * ty + r) * 8u + x]; }
  }
  // #endif
  for (var r = 0u; r < 2u; r++) {
    if (rows[r] >= n_q) { continue; }
    var l_fin = l_sums[r];
    var m_fin = m_run[r];
    let o_scale = sink_scale(h, &m_fin, &l_fin);
    let inv = select(0.0, o_scale / l_fin, l_fin > 0.0);
    let o_base = P.o_off + b_q * P.o_sb + (sq.q0 + rows[r]) * P.o_ss + h * P.o_sh;
    for (var j = 0u; j < T_D4 / 8u; j++) { store_out4(o_base + 4u * (tx + 8u * j), acc[r * T_D4 / 8u + j] * inv); }
    if (tx == 0u) { store_lse(b, h, sq, rows[r], m_fin, l_fin); }
  }
}
