// The one error type of flashtq: every rejected call names the argument and the rule it broke.
#pragma once

#include <stdexcept>
#include <string>

namespace flashtq {

class Error : public std::runtime_error {
 public:
  Error(std::string argument, std::string rule)
      : std::runtime_error("flashtq: argument '" + argument + "': " + rule),
        argument_(std::move(argument)),
        rule_(std::move(rule)) {}

  const std::string& argument() const noexcept { return argument_; }
  const std::string& rule() const noexcept { return rule_; }

 private:
  std::string argument_;
  std::string rule_;
};

}  // namespace flashtq
