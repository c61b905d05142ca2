#include "cuda/tensor_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include "cuda/cuda_check.hpp"

namespace flashtq::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FLASHTQ_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess) f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

std::optional<CUtensorMap> row_tile_map(const TensorView& t, unsigned rows) {
  constexpr std::int64_t kElement = 2, kLimit = std::int64_t(1) << 40;
  const cuuint64_t dims[4] = {cuuint64_t(t.shape[3]), cuuint64_t(t.shape[2]), cuuint64_t(t.shape[1]),
                              cuuint64_t(t.shape[0])};
  const std::int64_t strides[3] = {t.strides[2] * kElement, t.strides[1] * kElement, t.strides[0] * kElement};
  cuuint64_t byte_strides[3];
  for (int i = 0; i < 3; ++i) {
    if (strides[i] <= 0 || strides[i] % 16 != 0 || strides[i] >= kLimit) return std::nullopt;
    byte_strides[i] = cuuint64_t(strides[i]);
  }
  const cuuint32_t box[4] = {64, 1, rows, 1}, element_strides[4] = {1, 1, 1, 1};
  auto encode = encode_tiled();
  if (encode == nullptr) return std::nullopt;
  CUtensorMap map;
  const CUresult status = encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, t.data, dims, byte_strides, box,
                                 element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) return std::nullopt;
  return map;
}

}  // namespace flashtq::cuda
