// Non-owning views of 4-D tensors. flashtq never allocates or frees a caller's tensor.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace flashtq {

enum class DType : std::uint8_t { f32, f16, bf16 };

// Where a view's memory lives; a backend accepts only views of its own memory kind.
enum class Memory : std::uint8_t { host, cuda, webgpu };

constexpr std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
const char* dtype_name(DType t);

// A [B, S, H, D] tensor. Strides are in elements; D is always contiguous (strides[3] == 1).
// The default layout is seq-major with heads inner ([B, S, H, D] contiguous). PyTorch's
// [B, H, S, D] layout is the same logical tensor with permuted strides: see bhsd().
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::array<std::int64_t, 4> shape{};    // B, S, H, D
  std::array<std::int64_t, 4> strides{};  // in elements, for B, S, H, D
  Memory memory = Memory::host;

  // Contiguous [B, S, H, D] (the seeds' layout).
  static TensorView bshd(void* data, DType dtype, std::int64_t B, std::int64_t S, std::int64_t H, std::int64_t D,
                         Memory memory = Memory::host) {
    return {data, dtype, {B, S, H, D}, {S * H * D, H * D, D, 1}, memory};
  }
  // Memory laid out as contiguous [B, H, S, D] (PyTorch's layout), viewed as [B, S, H, D].
  static TensorView bhsd(void* data, DType dtype, std::int64_t B, std::int64_t H, std::int64_t S, std::int64_t D,
                         Memory memory = Memory::host) {
    return {data, dtype, {B, S, H, D}, {H * S * D, D, S * D, 1}, memory};
  }
};

}  // namespace flashtq
