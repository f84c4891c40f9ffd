#pragma once
// Internal to text/components.cc and text/decoders.cc: JSON field helpers and the pieces of
// tokenizer.json that several component kinds share.

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "text/regex.h"

namespace offloadd::text::detail {

using json = nlohmann::json;

// The "type" field, or "".
std::string TypeOf(const json& j);
// A required string field; the error names path.key.
StatusOr<std::string> GetString(const json& j, const char* key, const std::string& path);
bool GetBool(const json& j, const char* key, bool fallback);

// A Split/Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  Status FindAll(std::string_view s, std::vector<std::pair<size_t, size_t>>* out) const {
    if (regex) return regex->FindAll(s, out);
    if (literal.empty()) return OkStatus();
    for (size_t pos = s.find(literal); pos != std::string_view::npos;
         pos = s.find(literal, pos + literal.size())) {
      out->emplace_back(pos, pos + literal.size());
    }
    return OkStatus();
  }
};

// {"String": ...} or {"Regex": ...}.
StatusOr<Pattern> ParsePattern(const json& j, const std::string& path);
// `s` with every match replaced by `content`.
std::string ReplaceAll(std::string_view s, const std::vector<std::pair<size_t, size_t>>& m,
                       std::string_view content);

enum class PrependScheme { kAlways, kFirst, kNever };

// Metaspace's prepend_scheme (or the older add_prefix_space).
StatusOr<PrependScheme> ParsePrependScheme(const json& j, const std::string& path);
// A string that must hold exactly one character.
StatusOr<uint32_t> SingleCodePoint(const std::string& s, const std::string& path);

// Builds every element of the array j[key] with `make` (null results are skipped).
template <typename T>
StatusOr<std::vector<std::unique_ptr<T>>> MakeList(
    const json& j, const char* key, const std::string& path,
    const std::function<StatusOr<std::unique_ptr<T>>(const json&, const std::string&)>& make) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_array()) {
    return InvalidArgumentError(path + "." + key + ": missing or not an array");
  }
  std::vector<std::unique_ptr<T>> out;
  for (size_t i = 0; i < it->size(); ++i) {
    ASSIGN_OR_RETURN(auto step, make((*it)[i], path + "." + key + "[" + std::to_string(i) + "]"));
    if (step) out.push_back(std::move(step));
  }
  return out;
}

}  // namespace offloadd::text::detail
