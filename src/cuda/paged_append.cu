// Rows appended into pages (docs/spec.md §1.7): one block per (sequence, row, kv head) copies the key row and the
// value row to key seq_lens_k[b] + t of the sequence's pages, read through the table in device memory. Lengths and
// page indices are clamped as the paged forward clamps them, and a row past the table's reach is not written, so a
// bad device table never writes outside the pages.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace flashtq::cuda {
namespace {

// Row (b, t, h) of `rows` to row `slot` of page `page`, element by element (`Word`: the element's size).
template <typename Word>
__device__ void copy_row(const TensorView& pages, const TensorView& rows, std::int64_t page, std::int64_t slot,
                         std::int64_t b, std::int64_t t, std::int64_t h) {
  Word* dst = static_cast<Word*>(pages.data) + row_offset(pages, page, slot, h);
  const Word* src = static_cast<const Word*>(rows.data) + row_offset(rows, b, t, h);
  for (std::int64_t d = threadIdx.x; d < rows.shape[3]; d += blockDim.x) dst[d] = src[d];
}

template <typename Word>
__global__ void paged_append_kernel(PagedAppendCall c) {
  const PagedTable& pt = c.table;
  const std::int64_t T = c.k.shape[1], Hkv = c.k.shape[2];
  const std::int64_t row = blockIdx.x, h = row % Hkv, t = (row / Hkv) % T, b = row / (Hkv * T);
  const std::int64_t reach = pt.max_pages * pt.page_size;
  const std::int64_t length = std::min<std::int64_t>(std::max(pt.seq_lens_k[b], 0), reach);
  const std::int64_t j = length + t;
  if (j >= reach) return;
  const std::int64_t page =
      std::min<std::int64_t>(std::max(pt.page_table[b * pt.max_pages + j / pt.page_size], 0), pt.num_pages - 1);
  copy_row<Word>(c.k_pages, c.k, page, j % pt.page_size, b, t, h);
  copy_row<Word>(c.v_pages, c.v, page, j % pt.page_size, b, t, h);
}

}  // namespace

void launch_paged_append(const PagedAppendCall& c) {
  const std::int64_t rows = c.k.shape[0] * c.k.shape[1] * c.k.shape[2];
  if (rows == 0) return;
  auto stream = static_cast<cudaStream_t>(c.stream);
  const int threads = int(std::min<std::int64_t>(128, (c.k.shape[3] + 31) / 32 * 32));
  if (dtype_size(c.k.dtype) == 4) {
    paged_append_kernel<float><<<unsigned(rows), threads, 0, stream>>>(c);
  } else {
    paged_append_kernel<unsigned short><<<unsigned(rows), threads, 0, stream>>>(c);
  }
  FLASHTQ_CUDA_CHECK_LAUNCH("paged append");
}

}  // namespace flashtq::cuda
