// Helpers for the gates of the limits policy (kvgate/limits.hpp): a KVGATE_LIMIT_<NAME> override
// for one scope, and what a call threw.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>

#include "kvgate/limits.hpp"

namespace kvgate::gates {

// KVGATE_LIMIT_<name>=value for one scope (the gates run single-threaded).
class ScopedLimit {
 public:
  ScopedLimit(const std::string& name, std::uint64_t value) : var_("KVGATE_LIMIT_" + name) {
    ::setenv(var_.c_str(), std::to_string(value).c_str(), 1);
  }
  ~ScopedLimit() { ::unsetenv(var_.c_str()); }
  ScopedLimit(const ScopedLimit&) = delete;
  ScopedLimit& operator=(const ScopedLimit&) = delete;

 private:
  std::string var_;
};

// What `f` threw: a LimitError's message, "<ok>" when it returned, or the other exception marked.
template <class F>
std::string limit_refusal(F&& f) {
  try {
    f();
    return "<ok>";
  } catch (const limits::LimitError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a LimitError> ") + e.what();
  }
}

}  // namespace kvgate::gates
