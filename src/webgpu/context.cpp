#include "webgpu/context.hpp"

#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#define WGPU_SKIP_DECLARATIONS
#include <webgpu.h>
#include <wgpu.h>  // wgpu-native's own features (subgroups)

#include "flashtq/error.hpp"
#include "webgpu/shaders.hpp"

namespace flashtq::webgpu {

// wgpu-native's own extra (wgpu.h): wait for submitted work.
typedef WGPUBool (*ProcDevicePoll)(WGPUDevice device, WGPUBool wait, const void* submission_index);

// The procedures loaded from wgpu-native (clang-format is not stable on this list).
// clang-format off
#define FLASHTQ_WGPU_PROCS(X) \
  X(CreateInstance) X(InstanceRequestAdapter) X(InstanceProcessEvents) X(InstanceRelease) X(AdapterGetInfo) \
  X(AdapterInfoFreeMembers) X(AdapterGetLimits) X(AdapterHasFeature) X(AdapterRequestDevice) \
  X(AdapterRelease) X(DeviceGetQueue) X(DeviceCreateBuffer) X(BufferRelease) X(BufferDestroy) \
  X(QueueWriteBuffer) X(DeviceCreateCommandEncoder) X(CommandEncoderCopyBufferToBuffer) \
  X(CommandEncoderBeginComputePass) X(ComputePassEncoderSetPipeline) X(ComputePassEncoderSetBindGroup) \
  X(ComputePassEncoderDispatchWorkgroups) X(ComputePassEncoderEnd) X(ComputePassEncoderRelease) \
  X(CommandEncoderFinish) X(CommandEncoderRelease) X(QueueSubmit) X(CommandBufferRelease) X(BufferMapAsync) \
  X(BufferGetConstMappedRange) X(BufferUnmap) X(DeviceCreateShaderModule) X(ShaderModuleRelease) \
  X(DeviceCreateComputePipeline) X(ComputePipelineGetBindGroupLayout) X(BindGroupLayoutRelease) \
  X(DeviceCreateBindGroup) X(BindGroupRelease) X(DevicePushErrorScope) X(DevicePopErrorScope) \
  X(CommandEncoderClearBuffer)
// clang-format on

struct Api {
  void* library = nullptr;
#define FLASHTQ_DECLARE(name) WGPUProc##name name = nullptr;
  FLASHTQ_WGPU_PROCS(FLASHTQ_DECLARE)
#undef FLASHTQ_DECLARE
  ProcDevicePoll DevicePoll = nullptr;

  // Loads the library: $FLASHTQ_WGPU_NATIVE, else the copy set-up unpacked for this build, else
  // the loader's search path.
  static std::unique_ptr<Api> load(std::string& why) {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("FLASHTQ_WGPU_NATIVE")) candidates.emplace_back(env);
#ifdef FLASHTQ_WGPU_NATIVE_PATH
    candidates.emplace_back(FLASHTQ_WGPU_NATIVE_PATH);
#endif
    candidates.emplace_back("libwgpu_native.so");
    auto api = std::make_unique<Api>();
    for (const std::string& path : candidates) {
      api->library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (api->library) break;
    }
    if (!api->library) {
      why = "wgpu-native was not found (set FLASHTQ_WGPU_NATIVE or run scripts/fetch_wgpu_native.sh)";
      return nullptr;
    }
#define FLASHTQ_RESOLVE(name)                                                      \
  api->name = reinterpret_cast<WGPUProc##name>(dlsym(api->library, "wgpu" #name)); \
  if (!api->name) {                                                                \
    why = "wgpu-native lacks wgpu" #name;                                          \
    return nullptr;                                                                \
  }
    FLASHTQ_WGPU_PROCS(FLASHTQ_RESOLVE)
#undef FLASHTQ_RESOLVE
    api->DevicePoll = reinterpret_cast<ProcDevicePoll>(dlsym(api->library, "wgpuDevicePoll"));
    if (!api->DevicePoll) {
      why = "wgpu-native lacks wgpuDevicePoll";
      return nullptr;
    }
    return api;
  }
};

struct Device {
  WGPUInstance instance = nullptr;
  WGPUAdapter adapter = nullptr;
  WGPUDevice device = nullptr;
  WGPUQueue queue = nullptr;
  WGPULimits limits{};
  std::string description;
  Features features;  // the optional ones this device was created with
  bool cpu = false;
  bool lost = false;
  std::string lost_message;
};

namespace {

std::string text(WGPUStringView s) {
  if (!s.data) return {};
  return s.length == WGPU_STRLEN ? std::string(s.data) : std::string(s.data, s.length);
}
WGPUStringView view(const char* s) { return WGPUStringView{s, WGPU_STRLEN}; }

std::size_t page_size() {
  static const std::size_t p = std::size_t(sysconf(_SC_PAGESIZE));
  return p;
}

std::uint64_t round_up(std::uint64_t x, std::uint64_t m) { return (x + m - 1) / m * m; }

// Lets wgpu-native deliver callbacks (AllowProcessEvents mode) until `done` is set.
void process_until(const Api& w, WGPUInstance instance, const bool& done) {
  for (int i = 0; i < 100000 && !done; ++i) w.InstanceProcessEvents(instance);
}

}  // namespace

Context::Context() {
  std::string why;
  api_ = Api::load(why);
  if (!api_) throw Error("webgpu", why);
  const Api& w = *api_;
  dev_ = std::make_unique<Device>();
  WGPUInstanceDescriptor idesc{};
  dev_->instance = w.CreateInstance(&idesc);
  if (!dev_->instance) throw Error("webgpu", "wgpuCreateInstance failed");

  // Adapter: a discrete GPU when there is one (high-performance preference), else whatever the
  // platform offers — on a machine without a GPU, Mesa's lavapipe (a CPU Vulkan device).
  struct AdapterResult {
    bool done = false;
    WGPUAdapter adapter = nullptr;
    std::string message;
  } ar;
  WGPURequestAdapterOptions opts{};
  opts.powerPreference = WGPUPowerPreference_HighPerformance;
  opts.featureLevel = WGPUFeatureLevel_Core;
  WGPURequestAdapterCallbackInfo acb{};
  acb.mode = WGPUCallbackMode_AllowProcessEvents;
  acb.callback = [](WGPURequestAdapterStatus status, WGPUAdapter adapter, WGPUStringView message, void* u1, void*) {
    auto* r = static_cast<AdapterResult*>(u1);
    r->done = true;
    if (status == WGPURequestAdapterStatus_Success) r->adapter = adapter;
    r->message = text(message);
  };
  acb.userdata1 = &ar;
  w.InstanceRequestAdapter(dev_->instance, &opts, acb);
  process_until(w, dev_->instance, ar.done);
  if (!ar.adapter)
    throw Error("webgpu", "no WebGPU adapter: " + (ar.message.empty() ? std::string("none found") : ar.message));
  dev_->adapter = ar.adapter;
  WGPUAdapterInfo info{};
  w.AdapterGetInfo(dev_->adapter, &info);
  dev_->description = text(info.device) + " (" + text(info.description) + ")";
  dev_->cpu = info.adapterType == WGPUAdapterType_CPU;
  constexpr std::uint32_t kNvidia = 0x10DE, kApple = 0x106B;
  dev_->features.subgroup_size_fixed = dev_->cpu || info.vendorID == kNvidia || info.vendorID == kApple;
  dev_->features.subgroup_min_size = info.subgroupMinSize;
  dev_->features.subgroup_max_size = info.subgroupMaxSize;
  w.AdapterInfoFreeMembers(info);
  WGPULimits supported{};
  w.AdapterGetLimits(dev_->adapter, &supported);
  // The optional features the kernels have variants for, where the adapter offers them (the variants
  // without them stay the fall-back, and FLASHTQ_WEBGPU_FEATURES=none keeps to those).
  std::vector<WGPUFeatureName> wanted;
  const char* features_env = std::getenv("FLASHTQ_WEBGPU_FEATURES");
  const bool optional_allowed = !features_env || std::string(features_env) != "none";
  // Subgroups: the standard feature, or wgpu-native's own (0.32 offers only the latter, on Vulkan and Metal).
  for (const WGPUFeatureName subgroups :
       {WGPUFeatureName_Subgroups, static_cast<WGPUFeatureName>(WGPUNativeFeature_Subgroup)}) {
    if (optional_allowed && !dev_->features.subgroups && w.AdapterHasFeature(dev_->adapter, subgroups)) {
      wanted.push_back(subgroups);
      dev_->features.subgroups = true;
    }
  }
  if (optional_allowed && w.AdapterHasFeature(dev_->adapter, WGPUFeatureName_ShaderF16)) {
    wanted.push_back(WGPUFeatureName_ShaderF16);
    dev_->features.shader_f16 = true;
  }

  // The device asks for the adapter's own limits (storage buffers per stage, binding sizes).
  struct DeviceResult {
    bool done = false;
    WGPUDevice device = nullptr;
    std::string message;
  } dr;
  WGPUDeviceDescriptor ddesc{};
  ddesc.requiredLimits = &supported;
  ddesc.requiredFeatureCount = wanted.size();
  ddesc.requiredFeatures = wanted.data();
  ddesc.deviceLostCallbackInfo.mode = WGPUCallbackMode_AllowProcessEvents;
  ddesc.deviceLostCallbackInfo.callback = [](const WGPUDevice*, WGPUDeviceLostReason reason, WGPUStringView message,
                                             void* u1, void*) {
    if (reason == WGPUDeviceLostReason_Destroyed || reason == WGPUDeviceLostReason_CallbackCancelled) return;
    auto* d = static_cast<Device*>(u1);
    d->lost = true;
    d->lost_message = text(message);
  };
  ddesc.deviceLostCallbackInfo.userdata1 = dev_.get();
  WGPURequestDeviceCallbackInfo dcb{};
  dcb.mode = WGPUCallbackMode_AllowProcessEvents;
  dcb.callback = [](WGPURequestDeviceStatus status, WGPUDevice device, WGPUStringView message, void* u1, void*) {
    auto* r = static_cast<DeviceResult*>(u1);
    r->done = true;
    if (status == WGPURequestDeviceStatus_Success) r->device = device;
    r->message = text(message);
  };
  dcb.userdata1 = &dr;
  w.AdapterRequestDevice(dev_->adapter, &ddesc, dcb);
  process_until(w, dev_->instance, dr.done);
  if (!dr.device) throw Error("webgpu", "requesting a device failed: " + dr.message);
  dev_->device = dr.device;
  dev_->limits = supported;
  dev_->queue = w.DeviceGetQueue(dev_->device);
}

Context::~Context() = default;  // the process's context lives until exit; the driver reclaims it

Context& Context::get() {
  static Context* context = new Context();  // never destroyed: drivers may be gone at static destruction
  return *context;
}

namespace {
std::string& unusable_reason_text() {
  static std::string why;
  return why;
}
}  // namespace

bool Context::usable() {
  static const bool ok = [] {
    try {
      get();
      return true;
    } catch (const std::exception& e) {
      unusable_reason_text() = e.what();
      return false;
    }
  }();
  return ok;
}

std::string Context::unusable_reason() {
  usable();
  return unusable_reason_text();
}

std::string Context::adapter_description() {
  const std::uint32_t lanes = subgroup_lanes();
  std::string optional;
  if (dev_->features.subgroups) optional += "subgroups";
  if (lanes != 0) optional += " of " + std::to_string(lanes);
  if (dev_->features.shader_f16) optional += std::string(optional.empty() ? "" : ", ") + "shader-f16";
  return dev_->description + " [" + (optional.empty() ? std::string("no optional features") : optional) + "]";
}
const Features& Context::features() const { return dev_->features; }

std::uint32_t Context::subgroup_lanes() {
  std::call_once(lanes_once_, [this] {
    const Features& f = dev_->features;
    if (!f.subgroups) return;
    if (f.subgroup_min_size != 0) {
      lanes_ = f.subgroup_min_size;
      return;
    }
    if (!f.subgroup_size_fixed) return;
    constexpr std::uint32_t kInvocations = 128;
    std::vector<std::uint32_t> seen(kInvocations, 0);
    void* out = allocate(sizeof(std::uint32_t) * kInvocations);
    try {
      dispatch("subgroup_probe", {0, 0, 0, 0}, {{locate(out, 4 * kInvocations, "probe").buffer}}, 1, 1, 1);
      download(seen.data(), out, 4 * kInvocations);
    } catch (const Error&) {
      seen.assign(kInvocations, 0);  // no probe, no subgroup variants
    }
    release(out);
    const std::uint32_t size = seen[0] & 0xFFFFu;
    if (size == 0 || kInvocations % size != 0) return;
    for (std::uint32_t i = 0; i < kInvocations; ++i)
      if ((seen[i] & 0xFFFFu) != size || (seen[i] >> 16) != i % size) return;
    lanes_ = size;
  });
  return lanes_;
}
bool Context::is_cpu_adapter() const { return dev_->cpu; }
std::uint32_t Context::max_groups_per_dimension() const { return dev_->limits.maxComputeWorkgroupsPerDimension; }

void Context::check_errors(const char* what) {
  const Api& w = *api_;
  struct ScopeResult {
    bool done = false;
    WGPUErrorType type = WGPUErrorType_NoError;
    std::string message;
  };
  std::string failure;
  for (int scope = 0; scope < 2; ++scope) {  // out-of-memory, then validation (pushed in that order)
    ScopeResult r;
    WGPUPopErrorScopeCallbackInfo cb{};
    cb.mode = WGPUCallbackMode_AllowProcessEvents;
    cb.callback = [](WGPUPopErrorScopeStatus, WGPUErrorType type, WGPUStringView message, void* u1, void*) {
      auto* s = static_cast<ScopeResult*>(u1);
      s->done = true;
      s->type = type;
      s->message = text(message);
    };
    cb.userdata1 = &r;
    w.DevicePopErrorScope(dev_->device, cb);
    process_until(w, dev_->instance, r.done);
    if (r.type != WGPUErrorType_NoError && failure.empty()) {
      failure = std::string(r.type == WGPUErrorType_OutOfMemory ? "out of memory" : "error") + " in " + what + ": " +
                r.message;
    }
  }
  if (dev_->lost) throw Error("webgpu", "device lost: " + dev_->lost_message);
  if (!failure.empty()) throw Error("webgpu", failure);
}

namespace {
struct ErrorScopes {
  const Api& w;
  WGPUDevice d;
  ErrorScopes(const Api& api, WGPUDevice device) : w(api), d(device) {
    w.DevicePushErrorScope(d, WGPUErrorFilter_Validation);
    w.DevicePushErrorScope(d, WGPUErrorFilter_OutOfMemory);
  }
};
}  // namespace

void* Context::create_storage_buffer(std::uint64_t bytes, const char* what) {
  ErrorScopes scopes(*api_, dev_->device);
  WGPUBufferDescriptor desc{};
  desc.usage = WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc | WGPUBufferUsage_CopyDst;
  desc.size = bytes;
  WGPUBuffer buffer = api_->DeviceCreateBuffer(dev_->device, &desc);
  check_errors(what);
  return buffer;
}

void* Context::allocate(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::uint64_t padded = round_up(std::max<std::uint64_t>(bytes, 4), 4);
  if (padded > dev_->limits.maxBufferSize) {
    throw Error("bytes", std::to_string(bytes) + " exceeds the adapter's largest buffer (" +
                             std::to_string(dev_->limits.maxBufferSize) + ")");
  }
  const Api& w = *api_;
  auto buffer = static_cast<WGPUBuffer>(create_storage_buffer(padded, "allocate"));
  const std::size_t reserved = std::size_t(round_up(std::max<std::uint64_t>(bytes, 1), page_size()));
  void* base = mmap(nullptr, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    w.BufferDestroy(buffer);
    w.BufferRelease(buffer);
    throw Error("bytes", "could not reserve address space for a WebGPU buffer");
  }
  allocations_[reinterpret_cast<std::uintptr_t>(base)] = {buffer, bytes, padded, reserved};
  return base;
}

void Context::release(void* address) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(reinterpret_cast<std::uintptr_t>(address));
  if (it == allocations_.end()) return;
  api_->BufferDestroy(static_cast<WGPUBuffer>(it->second.buffer));
  api_->BufferRelease(static_cast<WGPUBuffer>(it->second.buffer));
  munmap(address, it->second.reserved);
  allocations_.erase(it);
}

Location Context::locate(const void* address, std::uint64_t bytes, const char* what) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto a = reinterpret_cast<std::uintptr_t>(address);
  auto it = allocations_.upper_bound(a);
  if (it == allocations_.begin())
    throw Error(what, "is not memory of the webgpu backend (allocate it with the backend)");
  --it;
  const std::uint64_t offset = a - it->first;
  if (offset > it->second.bytes || bytes > it->second.bytes - offset) {
    throw Error(what, "is not memory of the webgpu backend, or extends past its allocation");
  }
  return {it->second.buffer, offset, it->second.padded};
}

void* Context::dummy_buffer(int slot) {
  void*& d = dummies_[slot];
  if (!d) {
    d = allocate(16);
    const std::uint32_t zeros[4] = {};
    upload(d, zeros, sizeof zeros);
  }
  return locate(d, 16, "dummy").buffer;
}

void* Context::scratch(int slot, std::uint64_t bytes) {
  auto& s = scratch_[slot];
  if (s.second < bytes) {
    // Released, not destroyed: dispatches already queued may still use the old one.
    if (s.first) api_->BufferRelease(static_cast<WGPUBuffer>(s.first));
    s.second = round_up(std::max<std::uint64_t>(bytes, 16), 16);
    s.first = create_storage_buffer(s.second, "scratch buffer");
  }
  return s.first;
}

void* Context::scratch_holding(int slot, const std::vector<std::uint32_t>& words) {
  void* buffer = scratch(slot, std::max<std::uint64_t>(words.size(), 1) * 4);
  if (words.empty()) return buffer;
  std::lock_guard<std::mutex> lock(mutex_);
  ErrorScopes scopes(*api_, dev_->device);
  api_->QueueWriteBuffer(dev_->queue, static_cast<WGPUBuffer>(buffer), 0, words.data(), words.size() * 4);
  check_errors("scratch_holding");
  return buffer;
}

void Context::upload(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  const Location at = locate(dst, bytes, "dst");
  const std::uint64_t begin = at.offset & ~std::uint64_t(3), end = round_up(at.offset + bytes, 4);
  std::vector<std::uint8_t> words(end - begin);
  if (begin != at.offset || end != at.offset + bytes) {  // partial words at the edges: keep their other bytes
    download(words.data(), static_cast<std::uint8_t*>(dst) - (at.offset - begin),
             std::min<std::uint64_t>(end - begin, at.size - begin));
  }
  std::memcpy(words.data() + (at.offset - begin), src, bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  ErrorScopes scopes(*api_, dev_->device);
  api_->QueueWriteBuffer(dev_->queue, static_cast<WGPUBuffer>(at.buffer), begin, words.data(), words.size());
  check_errors("upload");
}

void Context::download(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  const Location at = locate(src, bytes, "src");
  const std::uint64_t begin = at.offset & ~std::uint64_t(3), end = std::min(round_up(at.offset + bytes, 4), at.size);
  const Api& w = *api_;
  std::lock_guard<std::mutex> lock(mutex_);
  ErrorScopes scopes(w, dev_->device);
  WGPUBufferDescriptor desc{};
  desc.usage = WGPUBufferUsage_MapRead | WGPUBufferUsage_CopyDst;
  desc.size = end - begin;
  WGPUBuffer staging = w.DeviceCreateBuffer(dev_->device, &desc);
  WGPUCommandEncoderDescriptor edesc{};
  WGPUCommandEncoder enc = w.DeviceCreateCommandEncoder(dev_->device, &edesc);
  w.CommandEncoderCopyBufferToBuffer(enc, static_cast<WGPUBuffer>(at.buffer), begin, staging, 0, end - begin);
  WGPUCommandBufferDescriptor cdesc{};
  WGPUCommandBuffer cmd = w.CommandEncoderFinish(enc, &cdesc);
  w.CommandEncoderRelease(enc);
  try {
    check_errors("download");
  } catch (...) {
    w.CommandBufferRelease(cmd);
    w.BufferRelease(staging);
    throw;
  }
  w.QueueSubmit(dev_->queue, 1, &cmd);
  w.CommandBufferRelease(cmd);
  ErrorScopes mapping(w, dev_->device);
  struct MapResult {
    bool done = false;
    WGPUMapAsyncStatus status = WGPUMapAsyncStatus_Error;
    std::string message;
  } mr;
  WGPUBufferMapCallbackInfo mcb{};
  mcb.mode = WGPUCallbackMode_AllowProcessEvents;
  mcb.callback = [](WGPUMapAsyncStatus status, WGPUStringView message, void* u1, void*) {
    auto* r = static_cast<MapResult*>(u1);
    r->done = true;
    r->status = status;
    r->message = text(message);
  };
  mcb.userdata1 = &mr;
  w.BufferMapAsync(staging, WGPUMapMode_Read, 0, end - begin, mcb);
  while (!mr.done && !dev_->lost) {
    w.DevicePoll(dev_->device, 1, nullptr);
    w.InstanceProcessEvents(dev_->instance);
  }
  if (mr.status == WGPUMapAsyncStatus_Success) {
    const auto* p = static_cast<const std::uint8_t*>(w.BufferGetConstMappedRange(staging, 0, end - begin));
    std::memcpy(dst, p + (at.offset - begin), bytes);
    w.BufferUnmap(staging);
  }
  w.BufferRelease(staging);
  check_errors("download");
  if (mr.status != WGPUMapAsyncStatus_Success) throw Error("webgpu", "reading a buffer back failed: " + mr.message);
}

// Variants of a dense shader's source (a kernel named "shader@variant+variant"): "wide" holds rows of head_dim up
// to 512 in each thread's arrays instead of 256 (a constant the dense kernels size them by); "d<N>" is built for
// head_dim N alone (N / 4 a row's vec4s, min(64, 2048 / N) keys a tile: backend.cpp's tile_rows), so its loops
// over a row have constant counts; "f16" and "bf16" fix the dtype the tiled forward unpacks; "real-f16" makes the
// shader's Real type f16; "subgroups" enables subgroup builtins and keeps the shader's "// #if subgroups" regions.
// The lines of `source` that a variant with (or without) subgroups keeps: those between "// #if subgroups" and
// "// #else" with them, those between "// #else" and "// #endif" without (WGSL has no preprocessor, and a subgroup
// builtin does not compile where the device lacks the feature).
static std::string select_regions(const std::string& source, bool subgroups) {
  std::string out;
  enum { everywhere, with, without } region = everywhere;
  for (std::size_t at = 0; at < source.size();) {
    const std::size_t end = std::min(source.find('\n', at), source.size());
    const std::string line = source.substr(at, end - at);
    at = end + 1;
    const std::size_t first = line.find_first_not_of(' ');
    const std::string text = first == std::string::npos ? "" : line.substr(first);
    if (text == "// #if subgroups") {
      region = with;
    } else if (text == "// #else" && region == with) {
      region = without;
    } else if (text == "// #endif" && region != everywhere) {
      region = everywhere;
    } else if (text.rfind("// #", 0) == 0) {
      throw Error("webgpu", "internal: a shader's region line '" + text + "' is not one select_regions knows");
    } else if (region == everywhere || (region == with) == subgroups) {
      out += line + "\n";
    }
  }
  return out;
}

static std::string shader_variant(std::string source, const std::string& variants) {
  std::string variant;
  auto set = [&](const std::string& constant, std::uint32_t value) {
    const std::string line = "const " + constant + ": u32 = ";
    const std::size_t at = source.find(line);
    if (at == std::string::npos) throw Error("webgpu", "internal: shader variant '" + variant + "' needs " + constant);
    const std::size_t end = source.find(';', at);
    source.replace(at, end - at, line + std::to_string(value) + "u");
  };
  for (std::size_t from = 0; from <= variants.size();) {  // variants joined by '+'
    const std::size_t plus = std::min(variants.find('+', from), variants.size());
    variant = variants.substr(from, plus - from);
    from = plus + 1;
    if (variant == "subgroups") {
      // WGSL's subgroup builtins (an adapter with the feature). Naga (wgpu-native 0.32) refuses the standard
      // `enable subgroups;` ("not yet implemented") and takes the builtins where the device has the feature.
    } else if (variant == "real-f16") {  // WGSL's f16 (an adapter with shader-f16): enabled first, and Real made f16
      const std::string alias = "alias Real = f32;";
      const std::size_t at = source.find(alias);
      if (at == std::string::npos) throw Error("webgpu", "internal: shader variant 'real-f16' needs " + alias);
      source = "enable f16;\n" + source.replace(at, alias.size(), "alias Real = f16;");
    } else if (variant == "wide") {
      set("MAX_D4", 128);
    } else if (variant == "f16" || variant == "bf16") {
      set("FIXED_DTYPE", variant == "f16" ? 1 : 2);
    } else if (variant.size() > 1 && variant[0] == 'd' &&
               variant.find_first_not_of("0123456789", 1) == std::string::npos) {
      const std::uint32_t d = std::uint32_t(std::stoul(variant.substr(1)));
      if (d == 0 || d % 4 != 0 || d > 512) throw Error("webgpu", "internal: no shader variant '" + variant + "'");
      set("MAX_D4", d / 4);
      set("FIXED_D4", d / 4);
      if (source.find("const FIXED_TILE: u32") != std::string::npos)
        set("FIXED_TILE", std::min<std::uint32_t>(64, 2048 / d));
    } else {
      throw Error("webgpu", "internal: no shader variant '" + variant + "' of this shader");
    }
  }
  return source;
}

void* Context::pipeline(const std::string& kernel) {
  auto it = pipelines_.find(kernel);
  if (it != pipelines_.end()) return it->second;
  const std::size_t hash = kernel.find('#');
  const std::string shader = kernel.substr(0, hash),
                    entry = hash == std::string::npos ? "main" : kernel.substr(hash + 1);
  const std::size_t at = shader.find('@');
  const std::string name = shader.substr(0, at);
  std::string source = shader_source(name);
  if (source.empty()) throw Error("webgpu", "no embedded shader named " + name);
  const std::string variants = at == std::string::npos ? "" : shader.substr(at + 1);
  source = select_regions(source, ("+" + variants + "+").find("+subgroups+") != std::string::npos);
  if (!variants.empty()) source = shader_variant(source, variants);
  const Api& w = *api_;
  ErrorScopes scopes(w, dev_->device);
  WGPUShaderSourceWGSL wgsl{};
  wgsl.chain.sType = WGPUSType_ShaderSourceWGSL;
  wgsl.code = view(source.c_str());
  WGPUShaderModuleDescriptor mdesc{};
  mdesc.nextInChain = &wgsl.chain;
  mdesc.label = view(name.c_str());
  WGPUShaderModule module = w.DeviceCreateShaderModule(dev_->device, &mdesc);
  WGPUComputePipelineDescriptor pdesc{};
  pdesc.label = view(name.c_str());
  pdesc.compute.module = module;
  pdesc.compute.entryPoint = view(entry.c_str());
  WGPUComputePipeline p = w.DeviceCreateComputePipeline(dev_->device, &pdesc);
  w.ShaderModuleRelease(module);
  check_errors(("compiling shader " + name).c_str());
  pipelines_[kernel] = p;
  return p;
}

void Context::dispatch(const std::string& kernel, const std::vector<std::uint32_t>& params,
                       const std::vector<Binding>& buffers, std::uint32_t gx, std::uint32_t gy, std::uint32_t gz) {
  const std::uint32_t limit = dev_->limits.maxComputeWorkgroupsPerDimension;
  if (gx > limit || gy > limit || gz > limit) {
    throw Error("shape", "needs " + std::to_string(gx) + " x " + std::to_string(gy) + " x " + std::to_string(gz) +
                             " workgroups; this adapter allows " + std::to_string(limit) + " per dimension");
  }
  if (gx == 0 || gy == 0 || gz == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const Api& w = *api_;
  auto pipe = static_cast<WGPUComputePipeline>(pipeline(kernel));
  ErrorScopes scopes(w, dev_->device);
  std::vector<std::uint32_t> uniform = params;
  uniform.resize(round_up(std::max<std::size_t>(uniform.size(), 4), 4), 0u);
  WGPUBufferDescriptor udesc{};
  udesc.usage = WGPUBufferUsage_Uniform | WGPUBufferUsage_CopyDst;
  udesc.size = uniform.size() * 4;
  WGPUBuffer ubuf = w.DeviceCreateBuffer(dev_->device, &udesc);
  w.QueueWriteBuffer(dev_->queue, ubuf, 0, uniform.data(), udesc.size);
  std::vector<WGPUBindGroupEntry> entries(1);
  entries[0].binding = 0;
  entries[0].buffer = ubuf;
  entries[0].size = udesc.size;
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    if (!buffers[i].buffer) continue;  // a binding this entry point does not use
    WGPUBindGroupEntry e{};
    e.binding = std::uint32_t(i + 1);
    e.buffer = static_cast<WGPUBuffer>(buffers[i].buffer);
    e.size = WGPU_WHOLE_SIZE;
    entries.push_back(e);
  }
  WGPUBindGroupLayout layout = w.ComputePipelineGetBindGroupLayout(pipe, 0);
  WGPUBindGroupDescriptor bdesc{};
  bdesc.layout = layout;
  bdesc.entryCount = entries.size();
  bdesc.entries = entries.data();
  WGPUBindGroup group = w.DeviceCreateBindGroup(dev_->device, &bdesc);
  WGPUCommandEncoderDescriptor edesc{};
  WGPUCommandEncoder enc = w.DeviceCreateCommandEncoder(dev_->device, &edesc);
  WGPUComputePassDescriptor cpdesc{};
  WGPUComputePassEncoder pass = w.CommandEncoderBeginComputePass(enc, &cpdesc);
  w.ComputePassEncoderSetPipeline(pass, pipe);
  w.ComputePassEncoderSetBindGroup(pass, 0, group, 0, nullptr);
  w.ComputePassEncoderDispatchWorkgroups(pass, gx, gy, gz);
  w.ComputePassEncoderEnd(pass);
  WGPUCommandBufferDescriptor cdesc{};
  WGPUCommandBuffer cmd = w.CommandEncoderFinish(enc, &cdesc);
  w.ComputePassEncoderRelease(pass);
  w.CommandEncoderRelease(enc);
  w.BindGroupRelease(group);
  w.BindGroupLayoutRelease(layout);
  w.BufferRelease(ubuf);
  // wgpu-native aborts the process on an invalid submission, so every error is caught before it.
  try {
    check_errors(("preparing " + kernel).c_str());
  } catch (...) {
    w.CommandBufferRelease(cmd);
    throw;
  }
  w.QueueSubmit(dev_->queue, 1, &cmd);
  w.CommandBufferRelease(cmd);
}

void Context::copy(void* src, std::uint64_t src_offset, void* dst, std::uint64_t dst_offset, std::uint64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  const Api& w = *api_;
  ErrorScopes scopes(w, dev_->device);
  WGPUCommandEncoderDescriptor edesc{};
  WGPUCommandEncoder enc = w.DeviceCreateCommandEncoder(dev_->device, &edesc);
  w.CommandEncoderCopyBufferToBuffer(enc, static_cast<WGPUBuffer>(src), src_offset, static_cast<WGPUBuffer>(dst),
                                     dst_offset, bytes);
  WGPUCommandBufferDescriptor cdesc{};
  WGPUCommandBuffer cmd = w.CommandEncoderFinish(enc, &cdesc);
  w.CommandEncoderRelease(enc);
  try {
    check_errors("copy");
  } catch (...) {
    w.CommandBufferRelease(cmd);
    throw;
  }
  w.QueueSubmit(dev_->queue, 1, &cmd);
  w.CommandBufferRelease(cmd);
}

void Context::wait_idle() {
  std::lock_guard<std::mutex> lock(mutex_);
  api_->DevicePoll(dev_->device, 1, nullptr);
  api_->InstanceProcessEvents(dev_->instance);
  if (dev_->lost) throw Error("webgpu", "device lost: " + dev_->lost_message);
}

}  // namespace flashtq::webgpu
