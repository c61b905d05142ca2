#pragma once

#include <memory>

#include "flashtq/backend.hpp"

namespace flashtq::cpu {
std::unique_ptr<Backend> make_backend();
}
