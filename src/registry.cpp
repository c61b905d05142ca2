// The backend registry: compiled-in backends in a fixed order, plus any registered at run time.
#include <mutex>
#include <string>

#include "core/entry_guard.hpp"
#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"
#include "cpu/backend.hpp"
#include "reference/backend.hpp"
#ifdef FLASHTQ_HAVE_CUDA
#include "cuda/backend.hpp"
#endif
#ifdef FLASHTQ_HAVE_WEBGPU
#include "webgpu/backend.hpp"
#endif

namespace flashtq {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

// Every backend, owned (a backend's address never changes), and the list all_backends() copies.
struct Registry {
  std::vector<std::unique_ptr<Backend>> owned;
  std::vector<Backend*> view;
  void add(std::unique_ptr<Backend> b) {
    view.push_back(b.get());
    owned.push_back(std::move(b));
  }
};

Registry& registry() {
  static Registry r = [] {
    Registry list;
    list.add(reference::make_backend());
    list.add(cpu::make_backend());
#ifdef FLASHTQ_HAVE_CUDA
    list.add(cuda::make_backend());
#endif
#ifdef FLASHTQ_HAVE_WEBGPU
    list.add(webgpu::make_backend());
#endif
    return list;
  }();
  return r;
}

}  // namespace

std::vector<Backend*> all_backends() try {
  // A copy taken under the lock: a caller iterating it races with no register_backend.
  std::lock_guard<std::mutex> lock(registry_mutex());
  return registry().view;
} catch (...) {
  core::rethrow_as_error("backend");
}

std::vector<Backend*> available_backends() try {
  std::vector<Backend*> list;
  for (Backend* b : all_backends()) {
    if (b->available()) list.push_back(b);
  }
  return list;
} catch (...) {
  core::rethrow_as_error("backend");
}

Backend& backend(const std::string& name) try {
  std::string names;
  for (Backend* b : all_backends()) {
    if (b->name() == name) {
      if (!b->available()) {
        const std::string why = b->unavailable_reason();
        throw Error("backend", "'" + name + "' is compiled in but not available on this machine" +
                                   (why.empty() ? "" : ": " + why));
      }
      return *b;
    }
    names += (names.empty() ? "" : ", ") + b->name();
  }
  throw Error("backend", "unknown name '" + name + "' (compiled in: " + names + ")");
} catch (...) {
  core::rethrow_as_error("backend");
}

Backend& default_backend() try {
  for (Backend* b : all_backends()) {
    if (b->name() == "cpu" && b->available()) return *b;
  }
  return backend("reference");
} catch (...) {
  core::rethrow_as_error("backend");
}

void register_backend(std::unique_ptr<Backend> b) try {
  if (!b) throw Error("backend", "must not be null");
  const std::string name = b->name();
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (Backend* existing : registry().view) {
    if (existing->name() == name) throw Error("backend", "name '" + name + "' is already registered");
  }
  registry().add(std::move(b));
} catch (...) {
  core::rethrow_as_error("backend");
}

}  // namespace flashtq
