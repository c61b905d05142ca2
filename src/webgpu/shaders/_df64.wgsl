// Double-float arithmetic (a value as hi + lo, two f32, about 48 significant bits): WGSL has no
// f64, and the TurboQuant encoder must reproduce the double-precision oracle's norm words exactly.
// Only exact products are ever added (products of 12-bit halves), so whether the compiler fuses
// a multiply into an add does not change any result. Shader compilers may also simplify
// (a + b) - a to b, which erases the rounding error these algorithms recover (seen on lavapipe:
// two_sum lost its error term), so intermediate sums pass through df_opaque(): a product with
// df_one, which a kernel using this file sets from its uniform block (1.0 at run time, unknown to
// the compiler).

var<private> df_one: f32 = 1.0;
fn df_opaque(x: f32) -> f32 { return x * df_one; }

// a + b exactly as s + e (Knuth).
fn two_sum(a: f32, b: f32) -> vec2<f32> {
  let s = df_opaque(a + b);
  let bb = df_opaque(s - a);
  return vec2<f32>(s, (a - (s - bb)) + (b - bb));
}
// a + b exactly as s + e, given |a| >= |b|.
fn quick_two_sum(a: f32, b: f32) -> vec2<f32> {
  let s = df_opaque(a + b);
  return vec2<f32>(s, b - (s - a));
}
// a as hi + lo with 12 significant bits each (hi rounded to nearest), so products of parts are exact.
fn split12(a: f32) -> vec2<f32> {
  let hi = bitcast<f32>((bitcast<u32>(a) + 0x800u) & 0xfffff000u);
  return vec2<f32>(hi, a - hi);
}
// a * b exactly as p + e (Dekker).
fn two_prod(a: f32, b: f32) -> vec2<f32> {
  let p = a * b;
  let x = split12(a);
  let y = split12(b);
  return vec2<f32>(p, ((x.x * y.x - p) + x.x * y.y + x.y * y.x) + x.y * y.y);
}

fn df_add(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
  var s = two_sum(a.x, b.x);
  let t = two_sum(a.y, b.y);
  s.y += t.x;
  s = quick_two_sum(s.x, s.y);
  s.y += t.y;
  return quick_two_sum(s.x, s.y);
}
fn df_neg(a: vec2<f32>) -> vec2<f32> { return vec2<f32>(-a.x, -a.y); }
fn df_sub(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> { return df_add(a, df_neg(b)); }
fn df_mul(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
  var p = two_prod(a.x, b.x);
  p.y += a.x * b.y + a.y * b.x;
  return quick_two_sum(p.x, p.y);
}
fn df_mul_f(a: vec2<f32>, b: f32) -> vec2<f32> {
  var p = two_prod(a.x, b);
  p.y += a.y * b;
  return quick_two_sum(p.x, p.y);
}
// a / b: an f32 quotient refined twice against the exact remainder.
fn df_div(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
  let q1 = a.x / b.x;
  var r = df_sub(a, df_mul_f(b, q1));
  let q2 = r.x / b.x;
  r = df_sub(r, df_mul_f(b, q2));
  let q3 = r.x / b.x;
  return df_add(quick_two_sum(q1, q2), vec2<f32>(q3, 0.0));
}
// sqrt(a) for a >= 0: an f32 root refined by two Newton steps on the exact residual.
fn df_sqrt(a: vec2<f32>) -> vec2<f32> {
  if (a.x <= 0.0) { return vec2<f32>(0.0, 0.0); }
  var s = vec2<f32>(sqrt(a.x), 0.0);
  for (var i = 0; i < 2; i++) {
    let r = df_sub(a, df_mul(s, s));
    s = df_add(s, vec2<f32>(r.x / (2.0 * s.x), 0.0));
  }
  return s;
}
// a < b, a >= b for normalised values.
fn df_lt(a: vec2<f32>, b: vec2<f32>) -> bool { return a.x < b.x || (a.x == b.x && a.y < b.y); }
fn df_ge(a: vec2<f32>, b: vec2<f32>) -> bool { return !df_lt(a, b); }
