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
  // The keys any row of this workgroup can see (uniform across the workgroup).
  let pos = i32(row) + sq.offset;
  let pos_first = i32(row0) + sq.offset;
  let pos_last = i32(min(row0 + ROWS, n_q) - 1u) + sq.offset;
  var k_begin = 0;
  var k_end = i32(n_k);
  if (P.causal != 0u && pos_last < k_end) { k_end = max(pos_last + 1, 0); }
  if (P.window > 0) {
    if (pos_first >= P.window) { k_begin = pos_first - P.window + 1; }
    if (P.causal == 0u && pos_last < k_end - P.window) { k_end = max(pos_last + P.window, 0); }
  }
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
          sc = P.scale * (dot4.x + dot4.y + dot4.z + dot4.w);
          if (P.softcap > 0.0) { sc = P.softcap * softcap_tanh(sc * PER_UNIT, P.softcap) * UNIT; }
          if (P.has_mask != 0u) {
            let m = MASK[m_base + u32(j) * P.m_sk];
            // masked whatever the key holds (NaN + -inf is NaN)
            sc = select(sc + m * UNIT, MASKED_UNITS, m == bitcast<f32>(NEG_INF_BITS));
          }
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
    // The head's sink logit (docs/spec.md §1.9) joins the maximum and the denominator, with no value;
    // -inf is no sink.
    var o_scale = 1.0;
    if (P.has_sinks != 0u) {
      let sink = SINKS[P.sinks_off + h] * UNIT;
      if (sink > bitcast<f32>(NEG_INF_BITS)) {
        let m_new = max(m_run, sink);
        o_scale = select(exp((m_run - m_new) * PER_UNIT), 0.0, l_run == 0.0);
        l_run = l_run * o_scale + exp((sink - m_new) * PER_UNIT);
        m_run = m_new;
      }
    }
    let inv = select(0.0, o_scale / l_run, l_run > 0.0);
    let o_base = P.o_off + b_q * P.o_sb + (sq.q0 + row) * P.o_ss + h * P.o_sh;
    for (var c = 0u; c < d4; c++) {
      let o = acc[c] * inv;
      store_out(o_base + 4u * c, o.x);
      store_out(o_base + 4u * c + 1u, o.y);
      store_out(o_base + 4u * c + 2u, o.z);
      store_out(o_base + 4u * c + 3u, o.w);
    }
    if (P.has_lse != 0u) {
      // [B, H, Sq], or [H, Tq] in a ragged batch
      let at = select(bh * P.Sq + row, h * P.total_q + sq.q0 + row, P.kv_layout == 1u);
      LSE[P.lse_off + at] = select(bitcast<f32>(NEG_INF_BITS), m_run * PER_UNIT + log(l_run), l_run > 0.0);
    }
  }
}
