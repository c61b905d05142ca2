// Prelude of every flashtq WGSL kernel: element conversions, the dropout hash, visibility.
// dtype codes: 0 f32, 1 f16, 2 bf16 (16-bit elements packed two to a u32 word, element 2i low).

const NEG_INF_BITS: u32 = 0xff800000u;
const MASKED: f32 = -1.0e30;  // a score at or below this counts as masked (docs/spec.md §1)

// Element `i` of a buffer of `dtype` elements, given the word holding it.
fn widen(word: u32, i: u32, dtype: u32) -> f32 {
  if (dtype == 0u) { return bitcast<f32>(word); }
  let half = (word >> (16u * (i & 1u))) & 0xffffu;
  if (dtype == 1u) { return unpack2x16float(half).x; }
  return bitcast<f32>(half << 16u);
}

// Word index of element `i`.
fn word_of(i: u32, dtype: u32) -> u32 {
  if (dtype == 0u) { return i; }
  return i >> 1u;
}

// f32 -> f16 bits, round to nearest even (as the reference's conversion).
fn f16_bits(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let sign = (b >> 16u) & 0x8000u;
  let a = b & 0x7fffffffu;
  if (a > 0x7f800000u) { return sign | 0x7e00u; }
  let e = i32(a >> 23u) - 127 + 15;
  let mant = a & 0x7fffffu;
  if (e >= 31) { return sign | 0x7c00u; }
  if (e <= 0) {
    if (e < -10) { return sign; }
    let m = mant | 0x800000u;
    let shift = u32(14 - e);
    var r = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (r & 1u) == 1u)) { r += 1u; }
    return sign | r;
  }
  var r = (u32(e) << 10u) | (mant >> 13u);
  let rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) == 1u)) { r += 1u; }
  return sign | r;
}

// f32 -> bf16 bits, round to nearest even.
fn bf16_bits(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) { return (b >> 16u) | 0x40u; }
  return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}

// Four 16-bit elements of `dtype` (1 f16, 2 bf16) as two words, exactly (the tiled kernels' workgroup memory), and back.
fn pack4_16(x: vec4<f32>, dtype: u32) -> vec2<u32> {
  if (dtype == 1u) { return vec2<u32>(pack2x16float(x.xy), pack2x16float(x.zw)); }
  let w = bitcast<vec4<u32>>(x);
  return vec2<u32>((w.x >> 16u) | (w.y & 0xffff0000u), (w.z >> 16u) | (w.w & 0xffff0000u));
}
fn unpack4_16(w: vec2<u32>, dtype: u32) -> vec4<f32> {
  if (dtype == 1u) { return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y)); }
  return bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u));
}

// Storing element `i` = x of a 16-bit buffer touches only its half of the word: returns the mask that
// keeps the other half (for atomicAnd) and x's bits in place (for atomicOr), so neighbours that share
// the word, possibly from other invocations, never race.
fn half_store(i: u32, x: f32, dtype: u32) -> vec2<u32> {
  let shift = 16u * (i & 1u);
  let bits = select(bf16_bits(x), f16_bits(x), dtype == 1u);
  return vec2<u32>(~(0xffffu << shift), bits << shift);
}

// The seed's hash (docs/spec.md §1): bit-exact across backends.
fn hash3(x: u32, y: u32, z: u32) -> f32 {
  var a = x * 1664525u + 1013904223u;
  var b = y * 1664525u + 1013904223u;
  var c = z * 1664525u + 1013904223u;
  a = a + b * c;
  b = b + c * a;
  c = c + a * b;
  a = a ^ (a >> 16u);
  b = b ^ (b >> 16u);
  c = c ^ (c >> 16u);
  return f32(a + b + c) * 2.3283064365386963e-10;
}

// Dropout factor of weight (bh, row, key): 0 when dropped, 1 / (1 - p) when kept.
fn dropout_factor(p: f32, seed: u32, bh: u32, row: u32, key: u32) -> f32 {
  if (p <= 0.0) { return 1.0; }
  return select(0.0, 1.0 / (1.0 - p), hash3(bh, row, key + seed) >= p);
}

// Whether key j is visible from absolute position pos (docs/spec.md §1).
fn key_visible(j: i32, pos: i32, sk: i32, causal: u32, window: i32) -> bool {
  if (j < 0 || j >= sk) { return false; }
  if (causal != 0u && j > pos) { return false; }
  if (window > 0) {
    // |pos - j| in u32: exact, where the i32 difference could overflow for far-negative positions.
    let dist = select(u32(pos) - u32(j), u32(j) - u32(pos), pos < j);
    if (dist >= u32(window)) { return false; }
  }
  return true;
}

// The rotated-query scratch [q_rot | q_jl | sums] (TqScratchLayout in include/flashtq/turboquant.hpp),
// `base` words into its buffer, region = rows * n_heads * head_dim: the one place WGSL computes it.
// part 0 is q_rot, part 1 q_jl; element d of (row, head) is at the returned index + d.
fn scratch_vector(base: u32, region: u32, part: u32, row: u32, n_heads: u32, head: u32, head_dim: u32) -> u32 {
  return base + part * region + (row * n_heads + head) * head_dim;
}
fn scratch_sum(base: u32, region: u32, row: u32, n_heads: u32, head: u32) -> u32 {
  return base + 2u * region + row * n_heads + head;
}

// docs/spec.md §1.8: cap * tanh(x / cap) and its derivative 1 - tanh^2 (cap > 0). tanh's argument is
// clamped at +-20, where f32's tanh is already +-1, since some drivers compute tanh as a ratio of
// exponentials that overflows to NaN for large arguments.
fn softcap_tanh(x: f32, cap: f32) -> f32 { return tanh(clamp(x / cap, -20.0, 20.0)); }
