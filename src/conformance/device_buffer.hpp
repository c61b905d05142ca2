// The conformance suite's buffers in a backend's memory: core's BackendBuffer.
#pragma once

#include "core/backend_buffer.hpp"

namespace flashtq::conformance {

using DeviceBuffer = core::BackendBuffer;

}  // namespace flashtq::conformance
