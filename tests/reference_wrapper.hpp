// A backend that forwards everything to the reference backend: tests derive from it and override
// the one behaviour they change (a deliberate bug, a workspace request).
#pragma once

#include <string>

#include "flashtq/backend.hpp"

namespace flashtq {

class ReferenceWrapper : public Backend {
 public:
  Memory memory() const override { return inner_.memory(); }
  void* allocate(std::size_t bytes) override { return inner_.allocate(bytes); }
  void release(void* ptr) override { inner_.release(ptr); }
  void upload(void* dst, const void* src, std::size_t bytes) override { inner_.upload(dst, src, bytes); }
  void download(void* dst, const void* src, std::size_t bytes) override { inner_.download(dst, src, bytes); }
  void forward(const ForwardCall& call) override { inner_.forward(call); }
  void backward(const BackwardCall& call) override { inner_.backward(call); }
  void tq_encode(const TqEncodeCall& call) override { inner_.tq_encode(call); }
  void tq_rotate_queries(const TqRotateCall& call) override { inner_.tq_rotate_queries(call); }
  void tq_attend(const TqAttendCall& call) override { inner_.tq_attend(call); }

 protected:
  Backend& inner_ = backend("reference");
};

}  // namespace flashtq
