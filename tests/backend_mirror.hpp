// Host tensors and arrays mirrored in a backend's memory for the calls of one test case: on a device backend each is
// copied there (outputs with their poison) and the outputs copied back by read_back(); on a host backend the host
// memory itself is used. So one test body checks host and device backends alike.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <vector>

#include "conformance/device_buffer.hpp"
#include "conformance/host_tensor.hpp"
#include "flashtq/backend.hpp"

namespace flashtq::testing {

// Those of `names` compiled into this build (usable here or not), for a suite's instantiation.
inline std::vector<const char*> compiled(std::initializer_list<const char*> names) {
  std::vector<const char*> out;
  for (const char* n : names)
    for (const Backend* b : all_backends())
      if (b->name() == n) out.push_back(n);
  return out;
}

// The backend named, or null with `why` set when it has no device here (the test then skips, saying so).
inline Backend* usable(const std::string& name, std::string& why) {
  for (Backend* b : all_backends()) {
    if (b->name() != name) continue;
    if (b->available()) return b;
    why = name + " has no device here: " + b->unavailable_reason();
    return nullptr;
  }
  why = name + " is not compiled in";
  return nullptr;
}

class Mirror {
 public:
  explicit Mirror(Backend& be) : be_(be) {}

  TensorView in(const conformance::HostTensor& t) { return at(t.view, place(t.bytes.data(), t.bytes.size())); }
  TensorView out(conformance::HostTensor& t) {
    const TensorView v = in(t);
    if (device()) back_.push_back({t.bytes.data(), &buffers_.back()});
    return v;
  }
  template <typename T>
  const T* in(const std::vector<T>& x) {
    return x.empty() ? nullptr : static_cast<const T*>(place(x.data(), x.size() * sizeof(T)));
  }
  template <typename T>
  T* out(std::vector<T>& x) {
    T* p = const_cast<T*>(in(x));
    if (device() && !x.empty()) back_.push_back({x.data(), &buffers_.back()});
    return p;
  }
  // The outputs' device copies into their host memory (waits for the backend).
  void read_back() {
    for (const Back& b : back_) {
      const std::vector<std::uint8_t> bytes = b.buffer->read<std::uint8_t>();
      std::memcpy(b.host, bytes.data(), bytes.size());
    }
  }

 private:
  struct Back {
    void* host;
    const conformance::DeviceBuffer* buffer;
  };
  bool device() const { return be_.memory() != Memory::host; }
  void* place(const void* host, std::size_t bytes) {
    if (!device()) return const_cast<void*>(host);
    const auto* p = static_cast<const std::uint8_t*>(host);
    buffers_.emplace_back(be_, std::vector<std::uint8_t>(p, p + bytes));
    return buffers_.back().get();
  }
  TensorView at(TensorView v, void* data) const {
    v.data = data;
    v.memory = be_.memory();
    return v;
  }
  Backend& be_;
  std::deque<conformance::DeviceBuffer> buffers_;  // stable addresses
  std::vector<Back> back_;
};

}  // namespace flashtq::testing
