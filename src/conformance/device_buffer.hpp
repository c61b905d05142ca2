// A buffer in a backend's memory, filled from and read back into host vectors.
#pragma once

#include <cstddef>
#include <vector>

#include "flashtq/backend.hpp"

namespace flashtq::conformance {

class DeviceBuffer {
 public:
  DeviceBuffer(Backend& backend, std::size_t bytes) : backend_(backend), bytes_(bytes) {
    ptr_ = backend.allocate(bytes == 0 ? 1 : bytes);
  }
  template <typename T>
  DeviceBuffer(Backend& backend, const std::vector<T>& host) : DeviceBuffer(backend, host.size() * sizeof(T)) {
    if (bytes_ > 0) backend.upload(ptr_, host.data(), bytes_);
  }
  ~DeviceBuffer() { backend_.release(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  std::vector<T> read() const {
    backend_.synchronize();
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_ > 0) backend_.download(host.data(), ptr_, bytes_);
    return host;
  }

 private:
  Backend& backend_;
  std::size_t bytes_;
  void* ptr_;
};

}  // namespace flashtq::conformance
