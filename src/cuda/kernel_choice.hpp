// Which CUDA kernel serves a call: one pure function per operation, of the call and the device, over
// one table of the kernels' tile shapes and head dims. The launchers switch on its answer (a kernel
// chosen here that cannot then be launched is an internal error, never a quiet fall-back),
// Backend::unsupported and the backend's record of the kernel that ran derive from it, and
// tests/test_kernel_choice.cpp holds it to the shapes each fast path is meant for.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "flashtq/config.hpp"
#include "flashtq/problem.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq::cuda {

enum class DenseForwardKernel : std::uint8_t {
  wgmma,         // Hopper warpgroup tensor cores fed by TMA (dense_wgmma.cu)
  decode,        // a few query rows per kv head against many keys, split-K on mma.sync (dense_decode.cu)
  mma,           // f16/bf16 mma.sync tiles, FlashAttention-2 style (dense_mma.cu)
  tf32,          // f32 on TF32 tensor cores, rounded or error-compensated (dense_tf32.cu)
  ffma,          // f32 FMA tiles, AttentionParams::pedantic_f32 (dense_ffma.cu)
  warp_per_row,  // anything else: a warp per query row (dense.cu)
};
enum class DenseBackwardKernel : std::uint8_t {
  wgmma,         // Hopper dK dV and dQ kernels (dense_backward_wgmma.cu)
  warp_per_row,  // a warp per query row for dQ, per key row for dK dV (dense.cu)
};
enum class TqAttendKernel : std::uint8_t {
  decode_mma,       // tensor-core decode of the seed layout at head_dim 128 (tq_decode_mma.cu), exact: for
                    // TqAttendArgs::exact
  decode_mma_bf16,  // the same kernel with the bf16-class key product (queries in 15-bit fixed point): the
                    // seed layout's default
  decode_tc,        // bf16 tensor-core decode of keys without QJL, codes turned into operands through tables of
                    // centroid pairs (tq_decode_tc.cu); bf16-class, the presets' code widths
  split_k,          // the scalar split-K kernel, every layout (tq_attend.cu)
  prefill_bf16,     // chunked prefill: the visible timesteps decoded to bf16, then the dense tensor-core
                    // forward (tq_prefill.cu); bf16-class, every layout
};

const char* kernel_name(DenseForwardKernel k);
const char* kernel_name(DenseBackwardKernel k);
const char* kernel_name(TqAttendKernel k);

// What the choice needs of the device: wgmma and TMA are sm_90 only, and TMA maps need the driver's
// cuTensorMapEncodeTiled.
struct DeviceTraits {
  bool hopper = false;
  bool tensor_maps = false;
};
DeviceTraits current_device_traits();  // of the current device, queried once per device

// How a row-blocked kernel orders its blocks (row_blocks.cuh): by head, or the heaviest row blocks
// first when rows see different numbers of keys.
enum class RowOrder { by_head, heaviest_first };
struct RowTiling {
  int rows;  // query rows per block
  RowOrder order;
};

// The table: tile shapes and head dims of every tiled kernel.
namespace tiles {
inline constexpr RowTiling kWgmmaForward{128, RowOrder::by_head};
inline constexpr RowTiling kMmaForward{128, RowOrder::heaviest_first};
inline constexpr RowTiling kTf32ForwardRounded{128, RowOrder::heaviest_first};
inline constexpr RowTiling kTf32ForwardCompensated{256, RowOrder::heaviest_first};
inline constexpr RowTiling kFfmaForward{128, RowOrder::heaviest_first};
inline constexpr int kWgmmaBackwardKeyRows = 128;    // key rows per dK dV block
inline constexpr int kWgmmaBackwardQueryRows = 128;  // query rows per dQ block
inline constexpr std::array<int, 3> kWgmmaForwardDims{64, 128, 256};
inline constexpr std::array<int, 4> kTiledForwardDims{32, 64, 96, 128};  // mma, tf32, ffma
inline constexpr std::array<int, 2> kWgmmaBackwardDims{64, 128};
// The decode kernel: its head dims, and the query columns (rows times the heads of a GQA group) one block takes
// (two mma n-tiles up to head_dim 128, one above: the accumulators of O^T are columns times D / 8 registers).
inline constexpr std::array<int, 3> kDecodeDims{64, 128, 256};
constexpr std::int64_t decode_columns(std::int64_t D) { return D <= 128 ? 16 : 8; }
inline constexpr std::array<int, 4> kTqDims{32, 64, 128, 256};  // every TurboQuant kernel
inline constexpr int kTqDecodeMmaDim = 128;
// The code widths the tensor-core decode of keys without QJL is built for (each an instantiation per head
// dim): the presets' (default 3/3 and 3+4/3 with outlier channels, quality 4/3, small 2+4/2).
struct TqCodeWidths {
  int key_bits, outlier_bits, value_bits;  // outlier_bits 0: no outlier channels
};
inline constexpr std::array<TqCodeWidths, 4> kTqDecodeTcWidths{{{3, 0, 3}, {3, 4, 3}, {4, 0, 3}, {2, 4, 2}}};
inline constexpr std::array<int, 3> kTqDecodeTcDims{64, 128, 256};
// Its key-coordinate groups of 32 must each lie in one part (outlier counts multiples of 32), and a tile of
// 16 timesteps in one mean block.
inline constexpr int kTqDecodeTcOutlierMultiple = 32;
inline constexpr int kTqDecodeTcLeastBlock = 16;
// Query rows from which a chunk is attended by decoding the cache once to bf16 (below them each row
// reads the packed words itself: decoding the whole cache costs a pass over six times the bytes).
inline constexpr std::int64_t kTqPrefillMinRows = 16;
}  // namespace tiles

template <std::size_t N>
constexpr bool built_for(const std::array<int, N>& dims, std::int64_t d) {
  for (int x : dims)
    if (x == d) return true;
  return false;
}

// Whether row blocks go in grid y.
FLASHTQ_HOST_DEVICE inline bool rows_in_y(const DenseProblem& p, RowOrder order) {
  return order == RowOrder::heaviest_first && (p.causal || p.window > 0);
}
// Whether the grid of a tiling fits (grid y takes at most 65535).
inline bool row_block_grid_fits(const DenseProblem& p, const RowTiling& t) {
  const std::int64_t row_blocks = (p.Sq + t.rows - 1) / t.rows, heads = p.B * p.H;
  const bool y = rows_in_y(p, t.order);
  return (y ? row_blocks : heads) <= 65535 && (y ? heads : row_blocks) <= 0x7FFFFFFF;
}
// Whether a view's rows start on 16 bytes (the tiled kernels' vector loads and copies).
bool rows_aligned16(const TensorView& t);
// Whether a TMA map can describe the view (byte strides positive, multiples of 16, below 2^40).
bool tensor_map_describable(const TensorView& t);

DenseForwardKernel choose_dense_forward(const ForwardCall& c, const DeviceTraits& device);
// The decode kernel's own conditions: f16/bf16 at tiles::kDecodeDims, Sq * group within
// tiles::decode_columns, no mask and no dropout, contiguous head dims and a grid that fits.
bool dense_decode_serves(const ForwardCall& c);
// Its conditions on the problem alone (what Backend::unsupported sees of a paged call).
bool paged_decode_serves(const DenseProblem& p);
DenseBackwardKernel choose_dense_backward(const BackwardCall& c, const DeviceTraits& device);
TqAttendKernel choose_tq_attend(const TqAttendCall& c, const DeviceTraits& device);
// The TurboQuant decision on the layout alone (the tensor-core decode also needs window 0).
bool tq_decode_mma_serves(const TqLayout& l, std::int64_t group, std::int64_t window);
// The tensor-core decode of keys without QJL (TqAttendKernel::decode_tc): bf16-class, so not for
// TqAttendArgs::exact; built for tiles::kTqDecodeTcWidths at tiles::kTqDecodeTcDims.
bool tq_decode_tc_serves(const TqLayout& l, bool exact);
// The chunked-prefill path (TqAttendKernel::prefill_bf16): a call of one start position for every
// sequence (start_pos, not start_positions) whose rows are not clamped by max_seq or capacity, not
// TqAttendCall::exact, of at least kTqPrefillMinRows rows, whose dense problem a tiled tensor-core
// forward serves. Its keys are timesteps [tq_prefill_first_key(c), start_pos + n_queries) of each
// sequence, decoded to bf16 in the workspace; tq_prefill_problem is the dense problem over them
// (causal, the offset placing row j at start_pos + j, the window as the call's).
bool tq_prefill_serves(const TqAttendCall& c, const DeviceTraits& device);
std::int64_t tq_prefill_first_key(const TqAttendCall& c);
DenseProblem tq_prefill_problem(const TqAttendCall& c);
// Why no CUDA TurboQuant kernel serves a layout, for Backend::unsupported; empty when one does.
std::string tq_unsupported(const TqLayout& l);

}  // namespace flashtq::cuda
