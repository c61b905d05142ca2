// Rows appended into pages (docs/spec.md §1.7): workgroup (b, t, h) copies row t of sequence b's keys and values
// (kv head h) to key seq_lens_k[b] + t of its pages, through the table the host checked and uploaded
// (TABLE = [page_table | seq_lens_k]).

struct Params {
  B: u32, T: u32, Hkv: u32, D: u32,
  dtype: u32, page_size: u32, max_pages: u32, y0: u32,  // y0: first row of this dispatch
  kp_off: u32, kp_sb: u32, kp_ss: u32, kp_sh: u32,
  vp_off: u32, vp_sb: u32, vp_ss: u32, vp_sh: u32,
  k_off: u32, k_sb: u32, k_ss: u32, k_sh: u32,
  v_off: u32, v_sb: u32, v_ss: u32, v_sh: u32,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> K: array<u32>;
@group(0) @binding(2) var<storage, read> V: array<u32>;
@group(0) @binding(3) var<storage, read> TABLE: array<u32>;
@group(0) @binding(4) var<storage, read_write> KP: array<atomic<u32>>;
@group(0) @binding(5) var<storage, read_write> VP: array<atomic<u32>>;

// Element bits of `word` holding element i (a whole word for f32, a half for f16 and bf16).
fn bits_of(word: u32, i: u32) -> u32 {
  if (P.dtype == 0u) { return word; }
  return (word >> (16u * (i & 1u))) & 0xffffu;
}

// Element i of a page buffer set to `bits`, copied as they are (NaN payloads too). 16-bit elements share words with
// their neighbours (possibly another row's), so only the element's half of the word is touched.
fn store_kp(i: u32, bits: u32) {
  if (P.dtype == 0u) { atomicStore(&KP[i], bits); return; }
  let shift = 16u * (i & 1u);
  atomicAnd(&KP[i >> 1u], ~(0xffffu << shift));
  atomicOr(&KP[i >> 1u], bits << shift);
}
fn store_vp(i: u32, bits: u32) {
  if (P.dtype == 0u) { atomicStore(&VP[i], bits); return; }
  let shift = 16u * (i & 1u);
  atomicAnd(&VP[i >> 1u], ~(0xffffu << shift));
  atomicOr(&VP[i >> 1u], bits << shift);
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let row = P.y0 + wid.x;
  let h = row % P.Hkv;
  let t = (row / P.Hkv) % P.T;
  let b = row / (P.Hkv * P.T);
  let j = TABLE[P.B * P.max_pages + b] + t;
  let page = TABLE[b * P.max_pages + j / P.page_size];
  let slot = j % P.page_size;
  let kp = P.kp_off + page * P.kp_sb + slot * P.kp_ss + h * P.kp_sh;
  let vp = P.vp_off + page * P.vp_sb + slot * P.vp_ss + h * P.vp_sh;
  let k = P.k_off + b * P.k_sb + t * P.k_ss + h * P.k_sh;
  let v = P.v_off + b * P.v_sb + t * P.v_ss + h * P.v_sh;
  for (var d = lid.x; d < P.D; d += 64u) {
    store_kp(kp + d, bits_of(K[word_of(k + d, P.dtype)], k + d));
    store_vp(vp + d, bits_of(V[word_of(v + d, P.dtype)], v + d));
  }
}
