#pragma once
// Rewrites a tokenizer.json regex (written for Oniguruma, which Hugging Face `tokenizers` uses,
// with its default Ruby syntax and Unicode 16 tables) into a PCRE2 pattern (UTF + UCP) that
// matches the same strings:
//   * \s and \S mean Unicode White_Space (PCRE2 also counts U+180E MONGOLIAN VOWEL SEPARATOR);
//   * \p{L}, \p{N}, \p{M}, \p{P}, \p{S}, their subcategories and \d also match the characters
//     that Unicode 15.0-16.0 assigned to them, which older PCRE2 tables lack (a union: harmless
//     where the library is newer);
//   * Ruby's \h / \H (hex digit) and \v (U+000B) replace PCRE2's whitespace classes.
// Inside a bracket class \P{..} and \D keep PCRE2's meaning (a complement cannot be widened
// there); no tokenizer.json seen uses them.

#include <string>
#include <string_view>

namespace offloadd::text {

std::string OnigToPcre2(std::string_view pattern);

}  // namespace offloadd::text
