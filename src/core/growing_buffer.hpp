// A buffer in a backend's memory that grows to the largest request and is kept (a cache's rotated queries,
// workspace and tables, reused call after call).
#pragma once

#include <cstddef>
#include <optional>

#include "core/backend_buffer.hpp"

namespace flashtq::core {

struct GrowingBuffer {
  std::optional<BackendBuffer> buffer;
  void* at_least(Backend& backend, std::size_t bytes) {
    if (!buffer || buffer->bytes() < bytes) {
      buffer.reset();  // the old one first: a device may not hold both
      buffer.emplace(backend, bytes);
    }
    return buffer->get();
  }
};

}  // namespace flashtq::core
