#pragma once
// A compiled PCRE2 regular expression in UTF + UCP mode (Unicode classes such as \p{L} and a
// Unicode-aware \s), JIT-compiled when the platform supports it. Hugging Face `tokenizers` uses
// Oniguruma; both are Perl-compatible for the patterns that tokenizer.json files carry.
// A Regex is immutable after Compile and safe to use from several threads at once.

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace offloadd::text {

class Regex {
 public:
  // Fails with INVALID_ARGUMENT naming the pattern and PCRE2's message and offset.
  static StatusOr<std::shared_ptr<const Regex>> Compile(std::string_view pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the byte ranges [begin, end) of the successive non-overlapping, non-empty matches in
  // `subject` (which must be valid UTF-8: the caller validates once, matching skips the check).
  Status FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace offloadd::text
