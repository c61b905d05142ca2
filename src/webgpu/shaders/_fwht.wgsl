// f32 Walsh-Hadamard butterflies over fwht_x[0..n), shared by the kernels that rotate in f32.
// fwht_round does one round of span `len`; the caller loops len = 1, 2, .. n / 2 with a
// workgroupBarrier() after each round, in its entry point (barriers stay out of functions).
// A vector may be rotated in parts (keys with outlier channels, _tq_parts.wgsl): each part
// [offset, offset + size) is transformed on its own, so its rounds stop at len = size.
var<workgroup> fwht_x: array<f32, 256>;

// The lower coordinate of butterfly pair k (of a part starting at `offset`) in the round of span `len`.
fn butterfly_low(k: u32, len: u32, offset: u32) -> u32 { return offset + (k / len) * 2u * len + k % len; }

// One round over the part (offset, size, ..) that holds pair k of the whole vector (k < n / 2): the
// part of coordinate 2k, as parts start at even coordinates.
fn fwht_part_round(k: u32, len: u32, n: u32, part: vec4<u32>) {
  if (k < n / 2u && len < part.y) {
    let i = butterfly_low(k - part.x / 2u, len, part.x);
    let a = fwht_x[i];
    let c = fwht_x[i + len];
    fwht_x[i] = a + c;
    fwht_x[i + len] = a - c;
  }
}

fn fwht_round(tid: u32, len: u32, n: u32) { fwht_part_round(tid, len, n, vec4<u32>(0u, n, 0u, 0u)); }
