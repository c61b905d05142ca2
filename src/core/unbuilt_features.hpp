// The dense features of docs/spec.md §1.6 a backend's kernels do not read yet: the backend
// refuses the problem (Backend::unsupported) rather than return numbers without them.
#pragma once

#include <optional>
#include <string>

#include "flashtq/problem.hpp"

namespace flashtq::core {

inline std::optional<std::string> varlen_unbuilt(const DenseProblem& p, const std::string& backend) {
  if (p.varlen || p.packed)
    return "ragged batches (varlen) are not implemented on the " + backend +
           " backend yet (reference, cpu and webgpu have them)";
  return std::nullopt;
}

// Paged keys with the table in device memory (docs/spec.md §1.7): a backend without a kernel that reads the table.
inline std::optional<std::string> paged_unbuilt(const DenseProblem& p, const std::string& backend) {
  if (p.paged)
    return "paged keys and values are not implemented on the " + backend +
           " backend yet (reference, cpu and webgpu with host tables, cuda's decode with device tables have them)";
  return std::nullopt;
}

}  // namespace flashtq::core
