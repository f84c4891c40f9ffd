#pragma once
// Internal: nlohmann::json throws on type mismatches (e.g. value("key", true) on a string).
// JSON-reading entry points run through GuardJson so that a malformed file becomes an
// INVALID_ARGUMENT naming it, never an uncaught exception.

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace offloadd::text {

template <typename F>
auto GuardJson(const std::string& where, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(where + ": " + e.what());
  }
}

}  // namespace offloadd::text
