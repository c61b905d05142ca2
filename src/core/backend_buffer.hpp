// A buffer in a backend's memory (host or device), freed with the backend; filled from and read
// back into host vectors. Movable, not copyable.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "flashtq/backend.hpp"

namespace flashtq::core {

class BackendBuffer {
 public:
  BackendBuffer(Backend& backend, std::size_t bytes) : backend_(&backend), bytes_(bytes) {
    ptr_ = backend.allocate(bytes == 0 ? 1 : bytes);
  }
  template <typename T>
  BackendBuffer(Backend& backend, const std::vector<T>& host) : BackendBuffer(backend, host.size() * sizeof(T)) {
    if (bytes_ > 0) backend.upload(ptr_, host.data(), bytes_);
  }
  ~BackendBuffer() {
    if (ptr_) backend_->release(ptr_);
  }
  BackendBuffer(BackendBuffer&& o) noexcept
      : backend_(o.backend_), bytes_(std::exchange(o.bytes_, 0)), ptr_(std::exchange(o.ptr_, nullptr)) {}
  BackendBuffer& operator=(BackendBuffer&& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(bytes_, o.bytes_);
    std::swap(ptr_, o.ptr_);
    return *this;
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  void* get() const { return ptr_; }
  std::size_t bytes() const { return bytes_; }
  template <typename T>
  std::vector<T> read() const {
    backend_->synchronize();
    std::vector<T> host(bytes_ / sizeof(T));
    if (bytes_ > 0) backend_->download(host.data(), ptr_, bytes_);
    return host;
  }
  template <typename T>
  void write(const std::vector<T>& host) {
    if (!host.empty()) backend_->upload(ptr_, host.data(), host.size() * sizeof(T));
  }
  // host's elements into elements [at, at + host.size()) of the buffer, the rest left as it is.
  template <typename T>
  void write_at(std::size_t at, const std::vector<T>& host) {
    if (!host.empty()) backend_->upload(static_cast<T*>(ptr_) + at, host.data(), host.size() * sizeof(T));
  }

 private:
  Backend* backend_;
  std::size_t bytes_;
  void* ptr_;
};

}  // namespace flashtq::core
