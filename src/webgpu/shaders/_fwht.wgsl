// f32 Walsh-Hadamard butterflies over fwht_x[0..n), shared by the kernels that rotate in f32.
// fwht_round does one round of span `len`; the caller loops len = 1, 2, .. n / 2 with a
// workgroupBarrier() after each round, in its entry point (barriers stay out of functions).
var<workgroup> fwht_x: array<f32, 256>;

fn fwht_round(tid: u32, len: u32, n: u32) {
  if (tid < n / 2u) {
    let i = (tid / len) * 2u * len + tid % len;
    let a = fwht_x[i];
    let c = fwht_x[i + len];
    fwht_x[i] = a + c;
    fwht_x[i + len] = a - c;
  }
}
