// Memory handling shared by the backends whose tensors live in host memory.
#pragma once

#include <cstdlib>
#include <cstring>
#include <new>

#include "flashtq/backend.hpp"

namespace flashtq::core {

class HostBackend : public Backend {
 public:
  Memory memory() const override { return Memory::host; }
  void* allocate(std::size_t bytes) override {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void release(void* ptr) override { std::free(ptr); }
  void upload(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { std::memcpy(dst, src, bytes); }
};

}  // namespace flashtq::core
