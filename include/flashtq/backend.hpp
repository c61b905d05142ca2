// The backend interface and registry. A backend computes what docs/spec.md defines on memory of one
// kind; it receives only calls that the validator has accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flashtq/attention.hpp"
#include "flashtq/problem.hpp"
#include "flashtq/turboquant.hpp"

namespace flashtq {

// A row of a TurboQuant encode whose norm f16 cannot hold (docs/spec.md §4).
struct TqRowNorm {
  std::int64_t timestep = 0, kv_head = 0;  // the row of x [1, T, n_kv_heads, head_dim]
  double norm = 0;                         // its length; NaN or inf for a row that holds one
  double stored = 0;                       // what its norm word would hold: the norm, or norm / |c[idx]|
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // What it runs on, for reports (the GPU or adapter); the name when there is nothing more to say.
  virtual std::string description() const { return name(); }
  virtual Memory memory() const = 0;
  // False when the backend is compiled in but cannot run here (no GPU, no adapter).
  virtual bool available() const { return true; }
  // Why it is not available (empty when it is, or when there is nothing more to say).
  virtual std::string unavailable_reason() const { return {}; }
  // A reason when this backend cannot run the problem (head dim, dtype); empty when it can.
  virtual std::optional<std::string> unsupported(const DenseProblem&) const { return std::nullopt; }
  virtual std::optional<std::string> unsupported(const TqLayout&) const { return std::nullopt; }
  // Why `ptr`, which a view says is in this backend's memory, is not (a host pointer handed to a
  // device backend); empty when it is, or when the backend cannot tell.
  virtual std::optional<std::string> foreign_pointer(const void*) const { return std::nullopt; }
  // Where a device backend reads the page table and lengths of a paged forward it runs as one call
  // (docs/spec.md §1.7): its own memory (cuda: a table a serving engine updates on the device) or host memory
  // (webgpu: checked whole, then uploaded with the call). Host backends gather each sequence's pages instead.
  virtual Memory page_table_memory() const { return memory(); }
  // Whether a device backend writes appended rows into pages itself (paged_append); host backends' pages are
  // written by core.
  virtual bool appends_pages() const { return false; }
  virtual void paged_append(const PagedAppendCall&) {}
  // Threads a host backend uses (0 = all cores); device backends ignore it.
  virtual void set_threads(int) {}
  virtual int threads() const { return 1; }
  // For benchmarks' rooflines: the f32 FMA rate (FLOP/s) the backend's threads reach on a tight loop
  // of independent FMAs (the median of a few runs); 0 where the backend has no such probe.
  virtual double measure_fma_flops() { return 0; }

  // Memory of this backend's kind, used by tools and the conformance suite.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  virtual void upload(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void download(void* dst, const void* src, std::size_t bytes) = 0;
  virtual void synchronize() {}

  virtual void forward(const ForwardCall& call) = 0;
  virtual void backward(const BackwardCall& call) = 0;
  virtual void tq_encode(const TqEncodeCall& call) = 0;  // keys or values: call.keys
  // For an encode of rows in this backend's device memory, which the validator cannot read on the host
  // (it checks host memory itself): the first row, timestep-major, whose norm f16 cannot hold, or empty
  // when every row fits. A device backend that does not implement it lets such rows store an f16 inf.
  virtual std::optional<TqRowNorm> tq_unstorable_row(const TqEncodeCall&) const { return std::nullopt; }
  virtual void tq_rotate_queries(const TqRotateCall& call) = 0;
  virtual void tq_attend(const TqAttendCall& call) = 0;
  // Workspace bytes tq_attend needs for a validated call.
  virtual std::size_t tq_attend_workspace(const TqAttendCall&) const { return 0; }
  // The workspace the forward's fastest plan for this call uses (ForwardArgs::workspace); 0 = none.
  virtual std::size_t forward_workspace(const ForwardCall&) const { return 0; }
  // The workspace the backward uses for this call (BackwardArgs::workspace); 0 = none.
  virtual std::size_t backward_workspace(const BackwardCall&) const { return 0; }
  // The kernel that served this thread's last forward, backward or tq_attend on this backend (the
  // conformance suite records it beside each case; tests hold the fast paths to the shapes they are
  // meant for). Empty for a backend with one path per operation.
  virtual std::string last_kernel() const { return {}; }
};

// Every compiled-in backend, available or not, in a fixed order (reference first), then the registered
// ones. Thread-safe: a snapshot, which register_backend on another thread does not change; the
// backends themselves live as long as the program.
std::vector<Backend*> all_backends();
// The available ones.
std::vector<Backend*> available_backends();
// By name ("reference", "cpu", "cuda", "webgpu"); an Error names the choices when not found.
Backend& backend(const std::string& name);
// The fastest available host backend ("cpu" when compiled in, else "reference").
Backend& default_backend();
// Adds a backend (for out-of-tree backends); the registry owns it.
void register_backend(std::unique_ptr<Backend> backend);

}  // namespace flashtq
