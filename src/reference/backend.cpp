// The `reference` backend: host views gathered into double arrays for the oracle, results
// rounded back into the caller's dtype.
#include "reference/backend.hpp"

#include <vector>

#include "core/elements.hpp"
#include "core/host_backend.hpp"
#include "reference/dense.hpp"
#include "reference/turboquant.hpp"

namespace flashtq::reference {
namespace {

std::vector<double> gather(const TensorView& t) {
  const auto [B, S, H, D] = t.shape;
  std::vector<double> x(std::size_t(B * S * H * D));
  std::size_t n = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d) x[n++] = core::load(t.data, t.dtype, core::offset(t, b, s, h) + d);
  return x;
}

void scatter(const std::vector<double>& x, const TensorView& t) {
  const auto [B, S, H, D] = t.shape;
  std::size_t n = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t d = 0; d < D; ++d) core::store(t.data, t.dtype, core::offset(t, b, s, h) + d, float(x[n++]));
}

class ReferenceBackend final : public core::HostBackend {
 public:
  std::string name() const override { return "reference"; }

  void forward(const ForwardCall& c) override {
    const DenseProblem& p = c.p;
    std::vector<double> out(std::size_t(p.B * p.Sq * p.H * p.D)), lse(std::size_t(p.B * p.H * p.Sq));
    dense_forward(p, gather(c.q).data(), gather(c.k).data(), gather(c.v).data(), out.data(), lse.data());
    scatter(out, c.out);
    if (c.lse != nullptr) {
      for (std::size_t i = 0; i < lse.size(); ++i) c.lse[i] = float(lse[i]);
    }
  }

  void backward(const BackwardCall& c) override {
    const DenseProblem& p = c.p;
    std::vector<double> lse(std::size_t(p.B * p.H * p.Sq));
    for (std::size_t i = 0; i < lse.size(); ++i) lse[i] = c.lse[i];
    std::vector<double> dq(std::size_t(p.B * p.Sq * p.H * p.D)), dk(std::size_t(p.B * p.Sk * p.Hkv * p.D)),
        dv(dk.size()), dsinks(std::size_t(p.H));
    dense_backward(p, gather(c.q).data(), gather(c.k).data(), gather(c.v).data(), gather(c.out).data(),
                   gather(c.dout).data(), lse.data(), dq.data(), dk.data(), dv.data(), dsinks.data());
    for (std::int64_t h = 0; h < p.H && c.dsinks != nullptr; ++h) c.dsinks[h] = float(dsinks[std::size_t(h)]);
    scatter(dq, c.dq);
    scatter(dk, c.dk);
    scatter(dv, c.dv);
  }

  void tq_encode(const TqEncodeCall& c) override { reference::tq_encode(c); }
  void tq_rotate_queries(const TqRotateCall& c) override { reference::tq_rotate_queries(c); }
  void tq_attend(const TqAttendCall& c) override { reference::tq_attend(c); }
};

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace flashtq::reference
