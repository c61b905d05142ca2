#include "reference/turboquant.hpp"

#include "core/tq_rows.hpp"

namespace flashtq::reference {

void tq_encode(const TqEncodeCall& c) {
  if (!core::tq_encode_uses_block_means(c)) return core::tq_encode_rows(c, 0, c.tokens());
  for (std::int64_t h = 0; h < c.layout().n_kv_heads; ++h) core::tq_encode_head_with_means(c, h);
}

void tq_rotate_queries(const TqRotateCall& c) { core::tq_rotate_rows(c, 0, c.rows()); }

void tq_attend(const TqAttendCall& c) {
  for (std::int64_t row = 0; row < c.rows(); ++row)
    for (std::int64_t h = 0; h < c.n_heads; ++h) core::tq_attend_row_head(c, row, h);
}

}  // namespace flashtq::reference
