// The `cuda` backend: device pointers and a cudaStream_t; no allocation in the operations (tq_attend's
// workspace is queried and passed), and no synchronisation but the TurboQuant encode's norm check.
#include "cuda/backend.hpp"

#include <cuda_runtime.h>

#include <vector>

#include "core/elements.hpp"
#include "core/tq_norm_rule.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernel_choice.hpp"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

class CudaBackend final : public Backend {
 public:
  std::string name() const override { return "cuda"; }
  std::string description() const override {
    int device = 0;
    cudaDeviceProp prop{};
    if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "no GPU";
    return prop.name;
  }
  Memory memory() const override { return Memory::cuda; }
  bool available() const override {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }
  std::optional<std::string> unsupported(const DenseProblem& p) const override {
    if (p.paged && !paged_decode_serves(p))
      return "paged keys and values run the decode kernel, which takes f16/bf16 at head_dim 64, 128 or 256, up to " +
             std::to_string(tiles::decode_columns(p.D)) +
             " query rows times query heads per kv head, no mask and no dropout";
    return std::nullopt;
  }
  std::optional<std::string> unsupported(const TqLayout& l) const override {
    std::string why = tq_unsupported(l);
    if (why.empty()) return std::nullopt;
    return why;
  }
  std::string last_kernel() const override { return last_kernel_; }

  // A kernel launched on a host pointer faults the context and the error surfaces in a later call;
  // the runtime knows every allocation it made or registered, so anything else is refused first.
  std::optional<std::string> foreign_pointer(const void* ptr) const override {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
      (void)cudaGetLastError();  // cannot tell: leave it to the launch
      return std::nullopt;
    }
    if (a.type != cudaMemoryTypeUnregistered) return std::nullopt;  // device, managed or registered host memory
    return "is a host pointer the CUDA runtime does not know (not device, managed or registered memory), in a view "
           "marked as cuda memory";
  }

  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    FLASHTQ_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  void release(void* ptr) override { cudaFree(ptr); }
  void upload(void* dst, const void* src, std::size_t bytes) override {
    FLASHTQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* dst, const void* src, std::size_t bytes) override {
    FLASHTQ_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void synchronize() override { FLASHTQ_CUDA_CHECK(cudaDeviceSynchronize()); }

  void forward(const ForwardCall& c) override {
    if (c.p.packed) return ragged_forward(c, [&](const ForwardCall& one) { forward(one); });
    const DenseForwardKernel k = choose_dense_forward(c, current_device_traits());
    if (c.p.paged && k != DenseForwardKernel::decode)
      throw Error("k",
                  "cuda: paged keys and values need page rows on 16 bytes (strides multiples of 8 elements, "
                  "the pages' start aligned)");
    last_kernel_ = kernel_name(k);
    launch_dense_forward(c, k);
  }
  std::size_t forward_workspace(const ForwardCall& c) const override {
    if (c.p.packed) return ragged_forward_workspace(c, [&](const ForwardCall& one) { return forward_workspace(one); });
    return choose_dense_forward(c, current_device_traits()) == DenseForwardKernel::decode ? dense_decode_workspace(c)
                                                                                          : 0;
  }
  std::size_t backward_workspace(const BackwardCall& c) const override {
    if (c.p.packed)
      return ragged_backward_workspace(c, [&](const BackwardCall& one) { return backward_workspace(one); });
    return choose_dense_backward(c, current_device_traits()) == DenseBackwardKernel::wgmma
               ? dense_backward_wgmma_workspace(c)
               : 0;
  }
  void backward(const BackwardCall& c) override {
    if (c.p.packed) return ragged_backward(c, [&](const BackwardCall& one) { backward(one); });
    const DenseBackwardKernel k = choose_dense_backward(c, current_device_traits());
    last_kernel_ = kernel_name(k);
    launch_dense_backward(c, k);
  }
  bool appends_pages() const override { return true; }
  void paged_append(const PagedAppendCall& c) override { launch_paged_append(c); }
  void tq_encode(const TqEncodeCall& c) override { launch_tq_encode(c); }
  // The check runs on the device; the row it finds is then copied back and described on the host, with
  // the oracle's arithmetic (an error path only).
  std::optional<TqRowNorm> tq_unstorable_row(const TqEncodeCall& c) const override {
    const bool means = c.layout().mean_block(c.keys) > 0;
    const double always = core::norm_always_fits(c.tables, c.keys) / (means ? core::kBlockResidualGrowth : 1.0);
    const std::optional<std::int64_t> row = first_unstorable_tq_row(c, always);
    if (!row) return std::nullopt;
    if (means || (c.keys && c.layout().key_outliers)) return unstorable_row_on_host(c);  // a candidate
    const std::int64_t H = c.layout().n_kv_heads, D = c.layout().head_dim, t = *row / H, h = *row % H;
    const std::size_t element = dtype_size(c.x.dtype);
    std::vector<unsigned char> bytes(std::size_t(D) * element);
    const auto* first =
        static_cast<const unsigned char*>(c.x.data) + core::offset(c.x, 0, t, h) * std::int64_t(element);
    FLASHTQ_CUDA_CHECK(cudaMemcpy(bytes.data(), first, bytes.size(), cudaMemcpyDeviceToHost));
    std::vector<double> values(static_cast<std::size_t>(D));
    for (std::int64_t d = 0; d < D; ++d) values[std::size_t(d)] = core::load(bytes.data(), c.x.dtype, d);
    const core::RowNorm r = core::row_norm(values, c.tables, c.keys);
    return TqRowNorm{t, h, r.norm, r.stored};
  }
  // A row the check kernel could not decide (keys with outlier channels: each part's norm half must fit,
  // which depends on the head's mask; block means): the rows and the masks are copied to the host and held
  // to the oracle's rule there (rare: only rows near f16's range get here).
  static std::optional<TqRowNorm> unstorable_row_on_host(const TqEncodeCall& c) {
    const TqLayout& l = c.layout();
    std::int64_t extent = c.x.shape[3];
    for (int d = 0; d < 3; ++d) extent += (c.x.shape[d] - 1) * c.x.strides[d];
    std::vector<unsigned char> rows(std::size_t(extent) * dtype_size(c.x.dtype));
    std::vector<std::uint32_t> masks(std::size_t(l.key_mask_words()));
    FLASHTQ_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(c.stream)));
    FLASHTQ_CUDA_CHECK(cudaMemcpy(rows.data(), c.x.data, rows.size(), cudaMemcpyDeviceToHost));
    FLASHTQ_CUDA_CHECK(
        cudaMemcpy(masks.data(), c.cache + l.key_mask_offset(), masks.size() * 4, cudaMemcpyDeviceToHost));
    TqEncodeCall host = c;
    host.x.data = rows.data();
    host.x.memory = Memory::host;
    return core::first_unstorable_row(host, masks.data());
  }
  void tq_rotate_queries(const TqRotateCall& c) override { launch_tq_rotate(c); }
  void tq_attend(const TqAttendCall& c) override {
    const TqAttendKernel k = choose_tq_attend(c, current_device_traits());
    last_kernel_ = kernel_name(k);
    launch_tq_attend(c, k);
  }
  std::size_t tq_attend_workspace(const TqAttendCall& c) const override {
    return cuda::tq_attend_workspace(c, choose_tq_attend(c, current_device_traits()));
  }

 private:
  static thread_local const char* last_kernel_;
};

thread_local const char* CudaBackend::last_kernel_ = "";

}  // namespace

std::unique_ptr<Backend> make_backend() { return std::make_unique<CudaBackend>(); }

}  // namespace flashtq::cuda
