// Sequences of a dense call (docs/spec.md §1.6-§1.7), for the dense kernels: sequence b's first packed query row and
// key, its rows and keys, its causal offset and its mask's first element. A kernel reads them from its sequence
// table (webgpu/backend.cpp's SequenceTable) and shares them with shared_sequence, so that its loops with barriers
// have uniform bounds.

struct Sequence {
  q0: u32, n_q: u32, k0: u32, n_k: u32, offset: i32, mask0: u32,
};

// Sequence b of a ragged batch from its table words: cu_seqlens_q[b], [b + 1], cu_seqlens_k[b], [b + 1] and its mask
// offset; its causal offset its keys minus its rows when `from_end`, else `offset`.
fn ragged_sequence(q0: u32, q1: u32, k0: u32, k1: u32, mask0: u32, offset: i32, from_end: bool) -> Sequence {
  return Sequence(q0, q1 - q0, k0, k1 - k0, select(offset, i32(k1 - k0) - i32(q1 - q0), from_end), mask0);
}

var<workgroup> seq_shared: array<u32, 6>;

// `s` as invocation 0 of the workgroup read it, as a uniform value.
fn shared_sequence(s: Sequence, lid: u32) -> Sequence {
  if (lid == 0u) {
    seq_shared = array<u32, 6>(s.q0, s.n_q, s.k0, s.n_k, bitcast<u32>(s.offset), s.mask0);
  }
  let w = workgroupUniformLoad(&seq_shared);
  return Sequence(w[0], w[1], w[2], w[3], bitcast<i32>(w[4]), w[5]);
}

// The keys [x, y) any of query rows [row0, row0 + rows) of sequence `s` can see, causal and window as the call's.
fn visible_key_range(s: Sequence, row0: u32, rows: u32, causal: u32, window: i32) -> vec2<i32> {
  let pos_first = i32(row0) + s.offset;
  let pos_last = i32(min(row0 + rows, s.n_q) - 1u) + s.offset;
  var k_begin = 0;
  var k_end = i32(s.n_k);
  if (causal != 0u && pos_last < k_end) { k_end = max(pos_last + 1, 0); }
  if (window > 0) {
    if (pos_first >= window) { k_begin = pos_first - window + 1; }
    if (causal == 0u && pos_last < k_end - window) { k_end = max(pos_last + window, 0); }
  }
  return vec2<i32>(k_begin, k_end);
}
