#pragma once

#include <memory>

#include "flashtq/backend.hpp"

namespace flashtq::cuda {
std::unique_ptr<Backend> make_backend();
}
