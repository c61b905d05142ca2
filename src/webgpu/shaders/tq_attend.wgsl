// TurboQuant attention over the packed cache (docs/spec.md §2), after the seed 003, split over the sequence:
//   partial: one workgroup per (split, up to four heads of a kv head, query row) scores tiles of 128
//            tokens straight from the packed words (thread t: token t of the tile, for every head of
//            the workgroup: each code decoded once), keeps running maxima and sums, and accumulates
//            values in rotated space (thread t: coordinates t, t + 128); writes (max, sum, acc[D]) of
//            each head to the workspace.
//   merge:   one workgroup per (head, query row) combines the splits by their maxima, normalises,
//            and rotates back once (inverse RHT_polar).
// Decode and chunked prefill are the same kernel: row j of sequence b sees timesteps
// [0, min(start_b + j + 1, max_seq, capacity)), with a sliding window only those after p - window.
// Keys with outlier channels are scored part by part (_tq_parts.wgsl: each part's norm half times its
// codes' dot with q_rot, the outlier part with its own centroids); with block means (docs/turboquant_layout.md)
// a coded key's score adds <q_rot, mu_b> (computed once per block and split) and the coded values of a block add
// (sum of their p) mu_b, its f16 mean read once per block and tile.

struct Params {
  D: u32, n_kv: u32, capacity: u32, key_bits: u32,
  value_bits: u32, H: u32, nq: u32, batch: u32,
  start_pos: i32, max_seq: i32, has_starts: u32, starts_off: u32,
  scale: f32, qjl_scale: f32, splits: u32, split_tokens: u32,
  scratch_off: u32, region: u32, k_off: u32, v_off: u32,
  key_words: u32, value_words: u32, key_jl_off: u32, key_norm_off: u32,
  value_norm_off: u32, ws_off: u32, out_off: u32, out_sb: u32,
  out_ss: u32, out_sh: u32, row0: u32, window: u32,  // row0: first query row of this dispatch; window 0 = none
  qjl: u32, sink: u32, recent: u32, exact_rows: u32,  // qjl 0: MSE-only keys; exact tokens (docs/spec.md §2.6)
  key_exact_off: u32, value_exact_off: u32, key_code_words: u32, key_norm_words: u32,
  n_parts: u32, outliers: u32, key_block: u32, value_block: u32,  // outliers: part 0 has its own centroids
  key_mean_off: u32, value_mean_off: u32, key_mean_blocks: u32, value_mean_blocks: u32,
  softcap: f32, has_sinks: u32, sinks_off: u32, exact_sets: u32,  // docs/spec.md §1.8, §1.9 (softcap 0 = none)
  // A pool (docs/turboquant_layout.md, "Pages"): PAGES holds each sequence's max_pages page indices, then each
  // one's exact set; reach = max_pages << page_shift clamps positions (capacity for a contiguous image).
  paged: u32, page_shift: u32, max_pages: u32, reach: u32,
  group: u32, head_chunks: u32, pf_first: u32, pf_keys: u32,  // heads per kv head; workgroups per (kv head, row);
  pf_q: u32, pf_o: u32, pf_k: u32, pf_v: u32,  // prefill: first timestep and timesteps decoded, ROWS' pieces
  polar: array<vec4<u32>, 2>,
  jl: array<vec4<u32>, 2>,  // the QJL projection's signs (TqTables::jl_sign_bits)
  parts: array<vec4<u32>, 6>,
  key_centroids: array<vec4<f32>, 4>,
  value_centroids: array<vec4<f32>, 4>,
  outlier_centroids: array<vec4<f32>, 4>,
};

@group(0) @binding(0) var<uniform> P: Params;
@group(0) @binding(1) var<storage, read> SCRATCH: array<f32>;
@group(0) @binding(2) var<storage, read> KEYS: array<u32>;
@group(0) @binding(3) var<storage, read> VALUES: array<u32>;
@group(0) @binding(4) var<storage, read> STARTS: array<i32>;
@group(0) @binding(5) var<storage, read_write> WS: array<f32>;
@group(0) @binding(6) var<storage, read_write> OUT: array<f32>;
@group(0) @binding(7) var<storage, read> SINKS: array<f32>;
@group(0) @binding(8) var<storage, read> PAGES: array<i32>;
// The chunked prefill's bf16 rows (pairs of elements in a word) in the workspace: rotated queries, the dense
// forward's output, and the decoded keys and values (prefill_* entry points; the workspace is WS elsewhere).
@group(0) @binding(9) var<storage, read_write> ROWS: array<u32>;

const TILE: u32 = 128u;

// The queries of the (up to) four heads a workgroup serves, component g for head g of its group.
var<workgroup> q_rot: array<vec4<f32>, 256>;
var<workgroup> q_jl: array<vec4<f32>, 256>;
var<workgroup> weight: array<vec4<f32>, 128>;   // score, then p * |v| of each token of the tile
var<workgroup> prob: array<vec4<f32>, 128>;     // p of each token of the tile
var<workgroup> partials: array<vec4<f32>, 32>;  // the first step of a reduction over the tile
var<workgroup> mean_dots: array<vec4<f32>, 33>;  // <q_rot, mu_b> of the split's key blocks (at most 256 / 8 + 1)
// The uniform centroid tables copied to workgroup memory (keys, outlier part, values: 16 entries each): a code
// picks its centroid per invocation, and a uniform array indexed by values that differ across invocations is
// read one distinct index at a time on some GPUs, while 16 consecutive words sit in distinct banks here.
var<workgroup> centroid_table: array<f32, 48>;
// The tile's tokens for the value sums, written once by the thread that scored them: the image timestep of a
// coded token, or EXACT_TOKEN | its exact row; its value block (with block means). The value code words of a run
// of the tile's tokens are staged in value_words with coalesced loads, so that the sums' loop over tokens reads
// workgroup memory and not one dependent global load per token.
const EXACT_TOKEN: u32 = 0x80000000u;
const VALUE_STAGE_WORDS: u32 = 256u;
var<workgroup> token_at: array<u32, 128>;
var<workgroup> token_block: array<u32, 128>;
var<workgroup> value_words: array<u32, 256>;
var<workgroup> running_max: vec4<f32>;
var<workgroup> correction: vec4<f32>;  // of the running sums, for the tile's new maxima
var<workgroup> begin_shared: u32;
var<workgroup> end_shared: u32;

// Every invocation calls it, before the workgroup's first barrier; the centroids are read after that barrier.
fn load_centroids(tid: u32) {
  if (tid < 16u) {
    centroid_table[tid] = P.key_centroids[tid / 4u][tid % 4u];
    centroid_table[16u + tid] = P.outlier_centroids[tid / 4u][tid % 4u];
    centroid_table[32u + tid] = P.value_centroids[tid / 4u][tid % 4u];
  }
}
// Key part 0 of a layout with outlier channels has centroids of its own.
fn key_centroid(idx: u32, outlier: bool) -> f32 { return centroid_table[select(0u, 16u, outlier) + idx]; }
fn value_centroid(idx: u32) -> f32 { return centroid_table[32u + idx]; }

fn f16_lo(w: u32) -> f32 { return unpack2x16float(w).x; }
fn f16_hi(w: u32) -> f32 { return unpack2x16float(w).y; }
// Element d of f16 pairs (element 2i in the low half of word i) starting at word `base`: block means.
fn key_mean(base: u32, d: u32) -> f32 { return unpack2x16float(KEYS[base + d / 2u])[d % 2u]; }
fn value_mean(base: u32, d: u32) -> f32 { return unpack2x16float(VALUES[base + d / 2u])[d % 2u]; }

// The code of b bits at bit `bit` (LSB first across words) of the stream starting at word `base`.
fn key_code(base: u32, bit: u32, bits: u32) -> u32 {
  var c = KEYS[base + bit / 32u] >> (bit % 32u);
  if ((bit % 32u) + bits > 32u) { c |= KEYS[base + bit / 32u + 1u] << (32u - bit % 32u); }
  return c & ((1u << bits) - 1u);
}
fn value_code(base: u32, d: u32, bits: u32) -> u32 {
  let bit = d * bits;  // values are one part
  var c = VALUES[base + bit / 32u] >> (bit % 32u);
  if ((bit % 32u) + bits > 32u) { c |= VALUES[base + bit / 32u + 1u] << (32u - bit % 32u); }
  return c & ((1u << bits) - 1u);
}

// The code of value dim d of the staged token whose words start at `base` in value_words.
fn staged_value_code(base: u32, d: u32, bits: u32) -> u32 {
  let bit = d * bits;
  var c = value_words[base + bit / 32u] >> (bit % 32u);
  if ((bit % 32u) + bits > 32u) { c |= value_words[base + bit / 32u + 1u] << (32u - bit % 32u); }
  return c & ((1u << bits) - 1u);
}

// The image's timestep that holds sequence b's timestep t: its page's, clamped to the pool, in a pool.
fn timestep(b: u32, t: u32) -> u32 {
  if (P.paged == 0u) { return t; }
  let pages = i32(P.capacity >> P.page_shift);
  let page = clamp(PAGES[b * P.max_pages + (t >> P.page_shift)], 0, pages - 1);
  return (u32(page) << P.page_shift) | (t & ((1u << P.page_shift) - 1u));
}

// Sequence b's exact set (a pool's sequences each have one; a contiguous image's is 0), clamped.
fn exact_set(b: u32) -> u32 {
  if (P.paged == 0u) { return 0u; }
  return u32(max(PAGES[P.batch * P.max_pages + b], 0));
}

// Timesteps query row `row` (= b * nq + j) sees.
fn seq_len(row: u32) -> u32 {
  let b = row / P.nq;
  let j = row % P.nq;
  var start = P.start_pos;
  if (P.has_starts != 0u) { start = STARTS[P.starts_off + b]; }
  // clamp(start + j + 1, 0, min(max_seq, reach)) without overflowing i32
  let limit = min(P.max_seq, i32(P.reach));
  if (start >= limit) { return u32(max(limit, 0)); }
  let s = start + i32(j) + 1;
  return u32(clamp(s, 0, max(limit, 0)));
}

// Where the sequence of query row `row` ends (TqAttendCall::sequence_end): its recent window's end.
fn sequence_end(row: u32) -> u32 {
  var start = P.start_pos;
  if (P.has_starts != 0u) { start = STARTS[P.starts_off + row / P.nq]; }
  let limit = min(P.max_seq, i32(P.reach));
  if (start >= limit) { return u32(max(limit, 0)); }
  return u32(clamp(start + i32(P.nq), 0, max(limit, 0)));
}

// The exact row (within a kv head's exact region) that holds timestep t, or -1 for its codes.
fn exact_row(t: u32, end: u32) -> i32 {
  if (t < P.sink) { return i32(t); }
  if (P.recent > 0u && t + P.recent >= end) { return i32(P.sink + (t - P.sink) % P.recent); }
  return -1;
}

// Element d of an exact row starting at word `base` (bf16 pairs, element 2i in the low half).
fn exact_key(base: u32, d: u32) -> f32 { return bitcast<f32>((KEYS[base + d / 2u] << (16u * (1u - d % 2u))) & 0xFFFF0000u); }
fn exact_value(base: u32, d: u32) -> f32 { return bitcast<f32>((VALUES[base + d / 2u] << (16u * (1u - d % 2u))) & 0xFFFF0000u); }

// The first timestep query row `row` sees: the sliding window's start (0 without one).
fn first_visible(row: u32) -> u32 {
  if (P.window == 0u) { return 0u; }
  var start = P.start_pos;
  if (P.has_starts != 0u) { start = STARTS[P.starts_off + row / P.nq]; }
  let p = max(start, 0) + i32(row % P.nq);
  if (p < i32(P.window)) { return 0u; }
  return u32(p) - P.window + 1u;
}

// The largest of v[0..128) of the workgroup array, per component, and the running maxima and correction updated
// by thread 0 (every thread calls it: it holds barriers; the result is uniform). Without subgroups 32 threads
// take four entries each, then thread 0 the 32 results; with them (subgroups of at least 32, lanes in invocation
// order: backend.cpp checks) each 32 lanes reduce by shuffles, then thread 0 takes the four results.
fn tile_max(tid: u32) -> vec4<f32> {
  // #if subgroups
  var x = weight[tid];
  for (var lanes = 16u; lanes > 0u; lanes >>= 1u) { x = max(x, subgroupShuffleXor(x, lanes)); }
  if (tid % 32u == 0u) { partials[tid / 32u] = x; }
  let n_partials = 4u;
  // #else
  if (tid < 32u) { partials[tid] = max(max(weight[tid], weight[tid + 32u]), max(weight[tid + 64u], weight[tid + 96u])); }
  let n_partials = 32u;
  // #endif
  workgroupBarrier();
  if (tid == 0u) {
    var m = running_max;
    for (var i = 0u; i < n_partials; i++) { m = max(m, partials[i]); }
    correction = exp(running_max - m);
    running_max = m;
  }
  workgroupBarrier();
  return running_max;
}

// The coded part of a key's score for the four heads: each part's norm half times its codes' dot with q_rot
// (the outlier part with its own centroids), the QJL correction; the block mean's dot comes in as `dot`.
fn coded_key_scores(keys: u32, kvh: u32, at: u32, D: u32, jl_sums: vec4<f32>, mean_dot: vec4<f32>) -> vec4<f32> {
  let slot = kvh * P.capacity + at;
  let codes = keys + slot * P.key_code_words;
  let norms = keys + P.key_norm_off + slot * P.key_norm_words;
  let jl = keys + P.key_jl_off + slot * (D / 32u);
  var dot = mean_dot;
  var positive = vec4<f32>(0.0);
  for (var p = 0u; p < P.n_parts; p++) {
    let part = P.parts[p];  // offset, size, bits, bit_offset
    let outlier = P.outliers != 0u && p == 0u;
    var polar = vec4<f32>(0.0);
    // The codes' words are read once each, and the next one when a word is started (a code advances at most one
    // word and may straddle two), so that its load is in flight while this word's codes are decoded; the QJL bits
    // likewise a word per 32 coordinates, the next one ahead, added without a branch.
    var at_word = part.w / 32u;
    var lo = KEYS[codes + at_word];
    var hi = KEYS[codes + at_word + 1u];
    var signs = 0u;
    var signs_next = 0u;
    if (P.qjl != 0u) { signs_next = KEYS[jl + part.x / 32u]; }
    for (var i = 0u; i < part.y; i++) {
      let bit = part.w + i * part.z;
      if (bit / 32u != at_word) {
        at_word = bit / 32u;
        lo = hi;
        hi = KEYS[codes + at_word + 1u];
      }
      var idx = lo >> (bit % 32u);
      if ((bit % 32u) + part.z > 32u) { idx |= hi << (32u - bit % 32u); }
      idx &= (1u << part.z) - 1u;
      let c = key_centroid(idx, outlier);
      let d = part.x + i;
      polar = fma(q_rot[d], vec4<f32>(c), polar);
      if (P.qjl != 0u) {
        if (i == 0u || d % 32u == 0u) {
          signs = signs_next;
          if (d / 32u + 1u < D / 32u) { signs_next = KEYS[jl + d / 32u + 1u]; }
        }
        positive = fma(vec4<f32>(f32((signs >> (d % 32u)) & 1u)), q_jl[d], positive);
      }
    }
    dot = fma(vec4<f32>(unpack2x16float(KEYS[norms + p / 2u])[p % 2u]), polar, dot);  // part p's norm half
  }
  if (P.qjl != 0u) {
    let nw = KEYS[norms];
    dot += f16_lo(nw) * f16_hi(nw) * P.qjl_scale * (2.0 * positive - jl_sums);
  }
  return dot;
}

// acc += p_sum mu_b at coordinates tid and tid + 128, for value block `block` of kv head kvh (none: 0xffffffff).
fn add_value_mean(values: u32, kvh: u32, block: u32, p_sum: vec4<f32>, tid: u32, D: u32, acc0: ptr<function, vec4<f32>>,
                  acc1: ptr<function, vec4<f32>>) {
  if (block == 0xffffffffu) { return; }
  let mean = values + P.value_mean_off + (kvh * P.value_mean_blocks + block) * (D / 2u);
  if (tid < D) { *acc0 = fma(p_sum, vec4<f32>(value_mean(mean, tid)), *acc0); }
  if (tid + TILE < D) { *acc1 = fma(p_sum, vec4<f32>(value_mean(mean, tid + TILE)), *acc1); }
}

// One workgroup per (split, up to four heads of one kv head, query row): each token's packed words are read and
// decoded once for the heads of its group (a GQA group of more than four heads takes several workgroups).
@compute @workgroup_size(128)
fn partial(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tid = lid.x;
  let split = wid.x;
  let kvh = wid.y / P.head_chunks;
  let h0 = kvh * P.group + (wid.y % P.head_chunks) * 4u;  // the first of this workgroup's heads
  let n_heads = min(4u, P.group - (wid.y % P.head_chunks) * 4u);
  let row = P.row0 + wid.z;
  let D = P.D;
  let b = row / P.nq;
  let t_begin = split * P.split_tokens;
  load_centroids(tid);
  if (tid == 0u) {
    end_shared = min(t_begin + P.split_tokens, seq_len(row));
    begin_shared = max(t_begin, first_visible(row));
    running_max = vec4<f32>(bitcast<f32>(NEG_INF_BITS));
  }
  // The bounds every thread loops over, made uniform for the barriers in the loop.
  let t_end = workgroupUniformLoad(&end_shared);
  let t_first = workgroupUniformLoad(&begin_shared);
  for (var i = tid; i < 4u * D; i += TILE) {  // the heads past the group's last hold zeros
    let g = i / D;
    let d = i % D;
    var qr = 0.0;
    var qj = 0.0;
    if (g < n_heads) {
      qr = SCRATCH[scratch_vector(P.scratch_off, P.region, 0u, row, P.H, h0 + g, D) + d];
      qj = SCRATCH[scratch_vector(P.scratch_off, P.region, 1u, row, P.H, h0 + g, D) + d];
    }
    q_rot[d][g] = qr;
    q_jl[d][g] = qj;
  }
  var jl_sums = vec4<f32>(0.0);
  for (var g = 0u; g < n_heads; g++) { jl_sums[g] = SCRATCH[scratch_sum(P.scratch_off, P.region, row, P.H, h0 + g)]; }
  workgroupBarrier();
  let keys = P.k_off + b * P.key_words;
  let values = P.v_off + b * P.value_words;
  let value_code_words = D * P.value_bits / 32u;
  let seq_end = sequence_end(row);
  let exact_base = (min(exact_set(b), P.exact_sets - 1u) * P.n_kv + kvh) * P.exact_rows * (D / 2u);
  // The key blocks' means, which the codes do not hold: their dots with q_rot once (thread j: the split's block j;
  // a block's first visible timestep finds its place in a pool, since a page holds whole blocks).
  let key_block = max(P.key_block, 1u);
  let first_block = t_first / key_block;
  if (P.key_block != 0u && t_first < t_end && tid <= (t_end - 1u) / key_block - first_block) {
    let at = timestep(b, max(t_first, (first_block + tid) * key_block));
    let mean = keys + P.key_mean_off + (kvh * P.key_mean_blocks + at / key_block) * (D / 2u);
    var dot = vec4<f32>(0.0);
    for (var d = 0u; d < D; d++) { dot = fma(q_rot[d], vec4<f32>(key_mean(mean, d)), dot); }
    mean_dots[tid] = dot;
  }
  workgroupBarrier();
  var acc0 = vec4<f32>(0.0);  // coordinate tid of the four heads' value sums (rotated space)
  var acc1 = vec4<f32>(0.0);  // coordinate tid + 128
  var sums = vec4<f32>(0.0);  // this thread's share of the four running sums (token tid of every tile)
  var t0 = t_first;
  loop {
    if (t0 >= t_end) { break; }  // uniform: every thread sees the same bounds
    // scores: thread tid takes token t0 + tid
    let t = t0 + tid;
    var s = vec4<f32>(bitcast<f32>(NEG_INF_BITS));
    let er = exact_row(t, seq_end);
    let at = timestep(b, t);  // its slot in the image: read once for the key, the value norm and the value sums
    if (t < t_end && er >= 0) {  // a sink or recent timestep: its exact rotated row
      let base = keys + P.key_exact_off + exact_base + u32(er) * (D / 2u);
      var dot = vec4<f32>(0.0);
      for (var d = 0u; d < D; d++) { dot = fma(q_rot[d], vec4<f32>(exact_key(base, d)), dot); }
      s = P.scale * dot;
    } else if (t < t_end) {
      var mean_dot = vec4<f32>(0.0);
      if (P.key_block != 0u) { mean_dot = mean_dots[t / key_block - first_block]; }
      s = P.scale * coded_key_scores(keys, kvh, at, D, jl_sums, mean_dot);
    }
    if (P.softcap > 0.0 && t < t_end) {  // docs/spec.md §1.8
      for (var g = 0u; g < 4u; g++) { s[g] = P.softcap * softcap_tanh(s[g], P.softcap); }
    }
    weight[tid] = s;
    if (t < t_end) {
      if (er >= 0) {
        token_at[tid] = EXACT_TOKEN | u32(er);
        token_block[tid] = 0xffffffffu;
      } else {
        token_at[tid] = at;
        token_block[tid] = select(0u, at / max(P.value_block, 1u), P.value_block != 0u);
      }
    }
    workgroupBarrier();
    let m = tile_max(tid);
    let corr = correction;
    var p = vec4<f32>(0.0);
    var w = vec4<f32>(0.0);
    if (t < t_end) {
      p = exp(s - m);
      w = p;
      if (er < 0) { w = p * f16_lo(VALUES[values + P.value_norm_off + kvh * P.capacity + at]); }
    }
    sums = fma(sums, corr, p);
    prob[tid] = p;
    weight[tid] = w;
    workgroupBarrier();
    // values in rotated space: coordinates tid and tid + 128
    acc0 *= corr;
    acc1 *= corr;
    let n = min(TILE, t_end - t0);
    var block = 0xffffffffu;       // the value block of the tokens summed in block_p (none yet)
    var block_p = vec4<f32>(0.0);  // their p: the block's mean is added once, times this sum
    let run = VALUE_STAGE_WORDS / value_code_words;  // tokens staged at a time: at least 8 (head_dim <= 256, 4 bits)
    for (var r0 = 0u; r0 < n; r0 += run) {  // uniform: n and run are the workgroup's
      let rn = min(run, n - r0);
      workgroupBarrier();  // the previous run's words are read
      for (var k = tid; k < rn * value_code_words; k += TILE) {
        let at = token_at[r0 + k / value_code_words];
        if (at < EXACT_TOKEN) { value_words[k] = VALUES[values + (kvh * P.capacity + at) * value_code_words + k % value_code_words]; }
      }
      workgroupBarrier();
      for (var i = r0; i < r0 + rn; i++) {
        let wi = weight[i];
        let at = token_at[i];
        if (at >= EXACT_TOKEN) {
          let eb = values + P.value_exact_off + exact_base + (at & ~EXACT_TOKEN) * (D / 2u);
          if (tid < D) { acc0 = fma(wi, vec4<f32>(exact_value(eb, tid)), acc0); }
          if (tid + TILE < D) { acc1 = fma(wi, vec4<f32>(exact_value(eb, tid + TILE)), acc1); }
          continue;
        }
        let base = (i - r0) * value_code_words;
        if (tid < D) { acc0 = fma(wi, vec4<f32>(value_centroid(staged_value_code(base, tid, P.value_bits))), acc0); }
        if (tid + TILE < D) {
          acc1 = fma(wi, vec4<f32>(value_centroid(staged_value_code(base, tid + TILE, P.value_bits))), acc1);
        }
        if (P.value_block != 0u) {  // p mu_b: the block's mean, which the codes do not hold
          if (token_block[i] != block) {
            add_value_mean(values, kvh, block, block_p, tid, D, &acc0, &acc1);
            block = token_block[i];
            block_p = vec4<f32>(0.0);
          }
          block_p += prob[i];
        }
      }
    }
    add_value_mean(values, kvh, block, block_p, tid, D, &acc0, &acc1);
    workgroupBarrier();
    t0 += TILE;
  }
  // The running sums: the threads' shares added up (each was scaled by every tile's correction).
  prob[tid] = sums;
  workgroupBarrier();
  if (tid < 32u) { partials[tid] = (prob[tid] + prob[tid + 32u]) + (prob[tid + 64u] + prob[tid + 96u]); }
  workgroupBarrier();
  for (var g = 0u; g < n_heads; g++) {
    let out = P.ws_off + ((row * P.H + h0 + g) * P.splits + split) * (D + 2u);
    if (tid < D) { WS[out + 2u + tid] = acc0[g]; }
    if (tid + TILE < D) { WS[out + 2u + tid + TILE] = acc1[g]; }
    if (tid == 0u) {
      var l = 0.0;
      for (var i = 0u; i < 32u; i++) { l += partials[i][g]; }
      WS[out] = running_max[g];
      WS[out + 1u] = l;
    }
  }
}

@compute @workgroup_size(256)
fn merge(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let d = lid.x;
  let h = wid.x;
  let row = P.row0 + wid.y;
  let D = P.D;
  let base = P.ws_off + (row * P.H + h) * P.splits * (D + 2u);
  // Head h's sink logit (docs/spec.md §1.9; -inf = none): one more split, with no value.
  var sink = bitcast<f32>(NEG_INF_BITS);
  if (P.has_sinks != 0u) { sink = SINKS[P.sinks_off + h]; }
  var M = sink;
  for (var s = 0u; s < P.splits; s++) { M = max(M, WS[base + s * (D + 2u)]); }
  var L = 0.0;
  if (sink > bitcast<f32>(NEG_INF_BITS)) { L = exp(sink - M); }
  var x = 0.0;
  for (var s = 0u; s < P.splits; s++) {
    let at = base + s * (D + 2u);
    let l = WS[at + 1u];
    if (l > 0.0) {
      let f = exp(WS[at] - M);
      L = fma(l, f, L);
      if (d < D) { x = fma(WS[at + 2u + d], f, x); }
    }
  }
  if (d < D) { fwht_x[d] = select(0.0, x / L, L > 0.0); }  // a row that sees nothing writes zeros
  rotate_back(d, row, h);
}

// Query row `row`, head h of the output from its rotated-space values in fwht_x (thread d: coordinate d): the
// inverse RHT (butterflies, then 1/sqrt(D) and the signs). Every invocation calls it: it holds barriers.
fn rotate_back(d: u32, row: u32, h: u32) {
  let D = P.D;
  workgroupBarrier();
  for (var len = 1u; len < D; len <<= 1u) {
    fwht_round(d, len, D);
    workgroupBarrier();
  }
  if (d < D) {
    let w = d / 32u;
    let sign = select(1.0, -1.0, ((P.polar[w / 4u][w % 4u] >> (d % 32u)) & 1u) != 0u);
    let b = row / P.nq;
    let j = row % P.nq;
    OUT[P.out_off + b * P.out_sb + j * P.out_ss + h * P.out_sh + d] = fwht_x[d] * (1.0 / sqrt(f32(D))) * sign;
  }
}

// ---- Chunked prefill (bf16-class, docs/spec.md §3): the chunk's rotated queries and every timestep it sees as
// bf16 rows (prefill_queries, prefill_rows), the dense forward over them (backend.cpp), each output row rotated
// back (prefill_finish). Each timestep is decoded once, not once per query row and head. ----

const PREFILL_STEPS: u32 = 8u;  // timesteps a prefill_rows workgroup decodes, one after another

fn bf16_pair(x: vec2<f32>) -> u32 { return bf16_bits(x.x) | (bf16_bits(x.y) << 16u); }

// Pairs of the rotated queries (the scratch's q_rot region, [rows, H, D]) as bf16, one pair a thread.
@compute @workgroup_size(128)
fn prefill_queries(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let i = (P.row0 + wid.x) * 128u + lid.x;
  if (i >= P.batch * P.nq * P.H * P.D / 2u) { return; }
  let q = scratch_vector(P.scratch_off, P.region, 0u, 0u, P.H, 0u, P.D) + 2u * i;
  ROWS[P.pf_q + i] = bf16_pair(vec2<f32>(SCRATCH[q], SCRATCH[q + 1u]));
}

// Key and value of timestep t (kv head kvh of sequence b) in q_rot's space at coordinates d0, d0 + 1 (thread
// d0 / 2): the exact row where there is one, else per part the norm half times the centroids, plus with QJL
// n gamma qjl_scale diag(s_jl) H sgn / sqrt(D) (so that <q_rot, k> carries the sketch's <q_jl, sgn>), plus the
// block's mean; values likewise without the sketch. Every invocation calls it (the sketch's butterflies hold
// barriers); those with d0 >= D only take part in them.
fn decode_pair(b: u32, kvh: u32, t: u32, d0: u32, end: u32, exact_base: u32, k: ptr<function, vec2<f32>>,
               v: ptr<function, vec2<f32>>) {
  let D = P.D;
  let in_row = d0 < D;
  let keys = P.k_off + b * P.key_words;
  let values = P.v_off + b * P.value_words;
  let er = exact_row(t, end);
  if (er >= 0) {
    if (in_row) {
      *k = vec2<f32>(exact_key(keys + P.key_exact_off + exact_base + u32(er) * (D / 2u), d0),
                     exact_key(keys + P.key_exact_off + exact_base + u32(er) * (D / 2u), d0 + 1u));
      *v = vec2<f32>(exact_value(values + P.value_exact_off + exact_base + u32(er) * (D / 2u), d0),
                     exact_value(values + P.value_exact_off + exact_base + u32(er) * (D / 2u), d0 + 1u));
    }
    return;
  }
  let at = timestep(b, t);
  let slot = kvh * P.capacity + at;
  let norms = keys + P.key_norm_off + slot * P.key_norm_words;
  if (in_row) {
    for (var e = 0u; e < 2u; e++) {
      let d = d0 + e;
      let p = part_of(P.parts, P.n_parts, d);
      let part = P.parts[p];
      let idx = key_code(keys + slot * P.key_code_words, part.w + (d - part.x) * part.z, part.z);
      let c = key_centroid(idx, P.outliers != 0u && p == 0u);
      (*k)[e] = unpack2x16float(KEYS[norms + p / 2u])[p % 2u] * c;
    }
  }
  if (P.qjl != 0u) {
    if (in_row) {
      let signs = KEYS[P.k_off + b * P.key_words + P.key_jl_off + slot * (D / 32u) + d0 / 32u] >> (d0 % 32u);
      fwht_x[d0] = select(-1.0, 1.0, (signs & 1u) != 0u);
      fwht_x[d0 + 1u] = select(-1.0, 1.0, (signs & 2u) != 0u);
    }
    for (var len = 1u; len < D; len <<= 1u) {
      workgroupBarrier();
      fwht_round(d0 / 2u, len, D);
    }
    workgroupBarrier();
    if (in_row) {
      let nw = KEYS[norms];
      let f = f16_lo(nw) * f16_hi(nw) * P.qjl_scale / sqrt(f32(D));
      for (var e = 0u; e < 2u; e++) {
        let d = d0 + e;
        let w = d / 32u;
        let sign = select(f, -f, ((P.jl[w / 4u][w % 4u] >> (d % 32u)) & 1u) != 0u);
        (*k)[e] = fma(sign, fwht_x[d], (*k)[e]);
      }
    }
    workgroupBarrier();  // before the next timestep's signs replace fwht_x
  }
  if (!in_row) { return; }
  if (P.key_block != 0u) {
    let mean = keys + P.key_mean_off + (kvh * P.key_mean_blocks + at / P.key_block) * (D / 2u);
    *k += vec2<f32>(key_mean(mean, d0), key_mean(mean, d0 + 1u));
  }
  let base = values + slot * (D * P.value_bits / 32u);
  let vn = f16_lo(VALUES[values + P.value_norm_off + slot]);
  let c0 = value_code(base, d0, P.value_bits);
  let c1 = value_code(base, d0 + 1u, P.value_bits);
  *v = vn * vec2<f32>(value_centroid(c0), value_centroid(c1));
  if (P.value_block != 0u) {
    let mean = values + P.value_mean_off + (kvh * P.value_mean_blocks + at / P.value_block) * (D / 2u);
    *v += vec2<f32>(value_mean(mean, d0), value_mean(mean, d0 + 1u));
  }
}

// Timesteps pf_first + s (s < pf_keys) of every sequence and kv head as bf16 rows [batch, pf_keys, n_kv, D]:
// a workgroup per (PREFILL_STEPS timesteps, sequence and kv head), thread i coordinates 2i and 2i + 1.
@compute @workgroup_size(128)
fn prefill_rows(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let tid = lid.x;
  let b = wid.y / P.n_kv;
  let kvh = wid.y % P.n_kv;
  let D = P.D;
  let end = u32(P.start_pos) + P.nq;  // the rows' sequence end: the prefill serves unclamped rows only
  let exact_base = (min(exact_set(b), P.exact_sets - 1u) * P.n_kv + kvh) * P.exact_rows * (D / 2u);
  load_centroids(tid);
  workgroupBarrier();
  for (var i = 0u; i < PREFILL_STEPS; i++) {
    let s = (P.row0 + wid.x) * PREFILL_STEPS + i;
    if (s >= P.pf_keys) { break; }  // uniform: the same for the whole workgroup
    var k = vec2<f32>(0.0);
    var v = vec2<f32>(0.0);
    decode_pair(b, kvh, P.pf_first + s, 2u * tid, end, exact_base, &k, &v);
    if (2u * tid < D) {
      let at = ((b * P.pf_keys + s) * P.n_kv + kvh) * (D / 2u) + tid;
      ROWS[P.pf_k + at] = bf16_pair(k);
      ROWS[P.pf_v + at] = bf16_pair(v);
    }
  }
}

// Output row `row`, head h: the dense forward's bf16 row (rotated space) rotated back into OUT.
@compute @workgroup_size(256)
fn prefill_finish(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
  let d = lid.x;
  let h = wid.x;
  let row = P.row0 + wid.y;
  if (d < P.D) {
    let i = (row * P.H + h) * P.D + d;
    fwht_x[d] = bitcast<f32>((ROWS[P.pf_o + i / 2u] << (16u * (1u - i % 2u))) & 0xFFFF0000u);
  }
  rotate_back(d, row, h);
}
