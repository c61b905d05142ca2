#pragma once

#include <memory>

#include "flashtq/backend.hpp"

namespace flashtq::webgpu {
std::unique_ptr<Backend> make_backend();
}
