#pragma once

#include <memory>

#include "flashtq/backend.hpp"

namespace flashtq::reference {
std::unique_ptr<Backend> make_backend();
}
