// The WebGPU device the `webgpu` backend runs on, reached through wgpu-native's webgpu.h, which is
// loaded at run time (so a build without the library, or a machine without an adapter, still
// works: the backend reports itself unavailable).
//
// Memory: allocate() returns an address inside a reserved, inaccessible range of the process's
// address space, one range per WebGPU buffer, so that views can point anywhere inside an
// allocation as with any device pointer; the backend maps such an address back to (buffer, byte
// offset) and passes element offsets to the kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace flashtq::webgpu {

struct Api;  // the loaded entry points
struct Device;

// A buffer of the device and the byte offset of an address inside it.
struct Location {
  void* buffer = nullptr;  // WGPUBuffer
  std::uint64_t offset = 0;
  std::uint64_t size = 0;  // of the whole buffer
};

// One binding of a dispatch: a storage buffer, read-only or read-write, as declared in the shader;
// null for a binding the entry point does not use.
struct Binding {
  void* buffer = nullptr;  // WGPUBuffer
};

// The optional WebGPU features the device was created with (requested wherever the adapter offers
// them, unless FLASHTQ_WEBGPU_FEATURES=none); kernels with a variant for one use it when it is here.
struct Features {
  bool subgroups = false;
  bool shader_f16 = false;
  std::uint32_t subgroup_min_size = 0;  // the adapter's range (0 when unknown)
  std::uint32_t subgroup_max_size = 0;
  // Whether every pipeline gets the same subgroup size (NVIDIA, Apple, a CPU adapter): then one measured
  // size stands for all, where the adapter reports none.
  bool subgroup_size_fixed = false;
};

class Context {
 public:
  // The process's context; an Error names what failed when there is no usable adapter.
  static Context& get();
  // Whether a context can be made here (library loadable, adapter found); never throws.
  static bool usable();
  // Why not, when usable() is false.
  static std::string unusable_reason();

  // The adapter and, in brackets, the optional features in use.
  std::string adapter_description();
  const Features& features() const;
  // The subgroup size every kernel may count on, with subgroups of consecutive invocations (lane = local index
  // mod size): the adapter's minimum where it reports one, else where the size is fixed one measured by a probe
  // kernel once (wgpu-native 0.32 reports none); 0 without subgroups or when not known.
  std::uint32_t subgroup_lanes();
  bool is_cpu_adapter() const;

  void* allocate(std::size_t bytes);
  void release(void* address);
  void upload(void* dst, const void* src, std::size_t bytes);
  void download(void* dst, const void* src, std::size_t bytes);
  // Where `address` lies; `bytes` from there must stay inside the buffer (an Error names `what`).
  Location locate(const void* address, std::uint64_t bytes, const char* what) const;
  // A small zeroed buffer for an optional binding that a call leaves out; one per slot, since a
  // writable binding may not share its buffer with any other binding of a dispatch.
  void* dummy_buffer(int slot);
  // A device-only scratch buffer of at least `bytes`, valid until the next call with the same slot.
  void* scratch(int slot, std::uint64_t bytes);
  // scratch(slot, ...) holding `words` (written in queue order, so the next dispatch reads them).
  void* scratch_holding(int slot, const std::vector<std::uint32_t>& words);

  // Runs `kernel` ("shader" for entry point main of shader.wgsl, or "shader#entry") over `groups`
  // workgroups; binding 0 is a uniform buffer holding `params`, bindings 1.. are `buffers`.
  void dispatch(const std::string& kernel, const std::vector<std::uint32_t>& params,
                const std::vector<Binding>& buffers, std::uint32_t groups_x, std::uint32_t groups_y,
                std::uint32_t groups_z);
  // Copies `bytes` (multiples of 4, as the offsets) between buffers, in queue order.
  void copy(void* src, std::uint64_t src_offset, void* dst, std::uint64_t dst_offset, std::uint64_t bytes);
  // Waits until every submitted dispatch has finished.
  void wait_idle();
  std::uint32_t max_groups_per_dimension() const;

 private:
  Context();
  ~Context();
  void* pipeline(const std::string& kernel);
  // A storage buffer (also a copy source and destination); an Error naming `what` when it fails.
  void* create_storage_buffer(std::uint64_t bytes, const char* what);
  void check_errors(const char* what);

  std::unique_ptr<Api> api_;
  std::unique_ptr<Device> dev_;
  mutable std::mutex mutex_;
  struct Allocation {
    void* buffer;
    std::uint64_t bytes;   // as requested
    std::uint64_t padded;  // buffer size (multiple of 4)
    std::size_t reserved;  // bytes of address space reserved
  };
  std::map<std::uintptr_t, Allocation> allocations_;  // by base address
  std::map<std::string, void*> pipelines_;
  std::map<int, std::pair<void*, std::uint64_t>> scratch_;
  std::map<int, void*> dummies_;
  std::once_flag lanes_once_;
  std::uint32_t lanes_ = 0;
};

}  // namespace flashtq::webgpu
