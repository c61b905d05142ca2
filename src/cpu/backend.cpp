// The `cpu` backend: Highway SIMD kernels dispatched at run time, OpenMP threads (all cores unless
// the caller sets a count with set_threads).
#include "cpu/backend.hpp"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/host_backend.hpp"
#include "cpu/dense.hpp"
#include "cpu/kernels.hpp"
#include "cpu/turboquant.hpp"

namespace flashtq::cpu {
namespace {

class CpuBackend final : public core::HostBackend {
 public:
  std::string name() const override { return "cpu"; }
  std::string description() const override { return std::string("cpu (") + simd_target() + " SIMD)"; }
  void set_threads(int n) override { threads_.store(n > 0 ? n : omp_get_num_procs()); }
  int threads() const override { return threads_.load(); }

  void forward(const ForwardCall& c) override { dense_forward(c, threads()); }
  void backward(const BackwardCall& c) override { dense_backward(c, threads()); }
  void tq_encode(const TqEncodeCall& c) override { cpu::tq_encode(c, threads()); }
  void tq_rotate_queries(const TqRotateCall& c) override { tq_rotate(c, threads()); }
  void tq_attend(const TqAttendCall& c) override { last_kernel_ = cpu::tq_attend(c, threads()); }
  std::string last_kernel() const override { return last_kernel_; }

  double measure_fma_flops() override {
    std::vector<double> rates;
    for (int run = 0; run < 3; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      double flops = 0;
      const int threads = this->threads();
#pragma omp parallel num_threads(threads) reduction(+ : flops)
      {
        float checksum = 0;
        flops += fma_burst(20'000'000, &checksum);
        if (checksum == 12345.0f) std::puts("");  // keeps the work observable
      }
      rates.push_back(flops / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(rates.begin(), rates.end());
    return rates[1];
  }

 private:
  // Read by every call, written by set_threads from any thread: a call takes the value current when it starts.
  std::atomic<int> threads_{std::max(1, omp_get_num_procs())};
  static thread_local const char* last_kernel_;
};

thread_local const char* CpuBackend::last_kernel_ = "";

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace flashtq::cpu
