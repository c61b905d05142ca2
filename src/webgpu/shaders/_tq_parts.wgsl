// The parts a TurboQuant vector is coded in (docs/turboquant_layout.md, "outlier channels"), as the
// kernels receive them: up to 6 entries (offset, size, bits, bit_offset), TqLayout::key_part's, for keys
// with outlier channels; every other vector is one part (0, head_dim, bits, 0). Coordinates are those of
// the permuted key: key_position gives where a kv head's channel goes.

// The part that coordinate i lies in.
fn part_of(parts: array<vec4<u32>, 6>, n_parts: u32, i: u32) -> u32 {
  var ps = parts;  // a variable: WGSL backends may refuse a dynamic index into an array value
  var p = 0u;
  for (var q = 1u; q < n_parts; q++) {
    if (i >= ps[q].x) { p = q; }
  }
  return p;
}

// Coordinate of channel c in the permuted key of a kv head whose outlier mask is `mask` (head_dim / 32
// words): the outlier channels ascending, then the others ascending (core::key_channel_order). A mask
// without exactly n_outliers bits set (an uncalibrated cache) means channels [0, n_outliers).
fn key_position(mask: array<u32, 8>, head_dim: u32, n_outliers: u32, c: u32) -> u32 {
  var m = mask;
  var n_set = 0u;
  var below = 0u;  // outlier channels among [0, c)
  for (var w = 0u; w < head_dim / 32u; w++) {
    n_set += countOneBits(m[w]);
    if (w < c / 32u) { below += countOneBits(m[w]); }
  }
  below += countOneBits(m[c / 32u] & ((1u << (c % 32u)) - 1u));
  var outlier = ((m[c / 32u] >> (c % 32u)) & 1u) != 0u;
  if (n_set != n_outliers) {
    outlier = c < n_outliers;
    below = min(c, n_outliers);
  }
  return select(n_outliers + c - below, below, outlier);
}
