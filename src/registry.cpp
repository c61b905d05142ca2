// The backend registry: compiled-in backends in a fixed order, plus any registered at run time.
#include <mutex>
#include <string>

#include "flashtq/backend.hpp"
#include "flashtq/error.hpp"
#include "cpu/backend.hpp"
#include "reference/backend.hpp"
#ifdef FLASHTQ_HAVE_CUDA
#include "cuda/backend.hpp"
#endif

namespace flashtq {
namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::vector<std::unique_ptr<Backend>>& owned() {
  static std::vector<std::unique_ptr<Backend>> backends = [] {
    std::vector<std::unique_ptr<Backend>> list;
    list.push_back(reference::make_backend());
    list.push_back(cpu::make_backend());
#ifdef FLASHTQ_HAVE_CUDA
    list.push_back(cuda::make_backend());
#endif
    return list;
  }();
  return backends;
}

}  // namespace

const std::vector<Backend*>& all_backends() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  static std::vector<Backend*> view;
  view.clear();
  for (auto& b : owned()) view.push_back(b.get());
  return view;
}

std::vector<Backend*> available_backends() {
  std::vector<Backend*> list;
  for (Backend* b : all_backends()) {
    if (b->available()) list.push_back(b);
  }
  return list;
}

Backend& backend(const std::string& name) {
  std::string names;
  for (Backend* b : all_backends()) {
    if (b->name() == name) {
      if (!b->available()) throw Error("backend", "'" + name + "' is compiled in but not available on this machine");
      return *b;
    }
    names += (names.empty() ? "" : ", ") + b->name();
  }
  throw Error("backend", "unknown name '" + name + "' (compiled in: " + names + ")");
}

Backend& default_backend() {
  for (Backend* b : all_backends()) {
    if (b->name() == "cpu" && b->available()) return *b;
  }
  return backend("reference");
}

void register_backend(std::unique_ptr<Backend> b) {
  if (!b) throw Error("backend", "must not be null");
  const std::string name = b->name();
  for (Backend* existing : all_backends()) {
    if (existing->name() == name) throw Error("backend", "name '" + name + "' is already registered");
  }
  std::lock_guard<std::mutex> lock(registry_mutex());
  owned().push_back(std::move(b));
}

}  // namespace flashtq
