// The last line behind docs/spec.md §4 at every public entry point, each a function-try-block whose
// handler is `catch (...) { core::rethrow_as_error(argument); }`: the validator checks arguments
// first, but an allocation it could not foresee (a size every check accepted that the allocator refuses)
// or a std:: exception from inside a backend (a registered one's own, say) must still reach the caller
// as the library's one error type, never as std::bad_alloc or std::length_error.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "flashtq/error.hpp"

namespace flashtq::core {

// Inside a catch handler: rethrows the exception being handled, an Error as it is and a std:: exception
// as an Error naming `argument` (the one whose size asked for the memory, where the entry point knows it).
[[noreturn]] inline void rethrow_as_error(const char* argument) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw Error(argument, "out of memory: an allocation this call needs failed (std::bad_alloc)");
  } catch (const std::exception& e) {
    throw Error(argument, std::string("failed inside flashtq: ") + e.what());
  }
}

}  // namespace flashtq::core
