// 64-bit size arithmetic that reports overflow as a library error naming the argument.
#pragma once

#include <cstdint>
#include <string>

#include "flashtq/error.hpp"

namespace flashtq::core {

inline std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw Error(argument, "element count overflows 64 bits");
  return r;
}

inline std::int64_t checked_add(std::int64_t a, std::int64_t b, const std::string& argument) {
  std::int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw Error(argument, "element count overflows 64 bits");
  return r;
}

}  // namespace flashtq::core
