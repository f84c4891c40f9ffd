#pragma once
// UTF-8 helpers shared by the tokenizer: code point iteration, the GPT-2 byte<->unicode table,
// lossy decoding with the same replacement rule as Rust's String::from_utf8_lossy (which the
// Hugging Face `tokenizers` decoders use), and Unicode normalization forms through ICU.
// All functions are pure and thread-safe.

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace offloadd::text {

// Length in bytes of the UTF-8 sequence starting with `lead` (1 for invalid lead bytes).
size_t Utf8SeqLen(unsigned char lead);

// Decodes the code point at s[*pos] and advances *pos. `s` must be valid UTF-8.
uint32_t NextCodePoint(std::string_view s, size_t* pos);

void AppendUtf8(uint32_t cp, std::string* out);

// True when `s` is well-formed UTF-8 (no overlongs, no surrogates, <= U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Replaces each maximal invalid subsequence with U+FFFD (Unicode "substitution of maximal
// subparts", as Rust's from_utf8_lossy and Python's errors="replace" do).
std::string Utf8Lossy(std::string_view bytes);

// Rust's char::is_whitespace (Unicode White_Space property).
bool IsUnicodeWhitespace(uint32_t cp);

// GPT-2's reversible byte -> printable code point table.
uint32_t ByteToCodePoint(uint8_t b);
// Inverse of ByteToCodePoint; -1 when `cp` is not in the table.
int CodePointToByte(uint32_t cp);
// Maps every byte of `s` through ByteToCodePoint (the ByteLevel pre-tokenizer's alphabet).
std::string ByteLevelEncode(std::string_view s);

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
// Unicode normalization of valid UTF-8 text.
StatusOr<std::string> Normalize(std::string_view s, NormalForm form);
// True when text can be split before `cp` without changing its normalization.
bool HasBoundaryBefore(uint32_t cp, NormalForm form);
// Full Unicode lowercase mapping (locale-independent).
StatusOr<std::string> Lowercase(std::string_view s);
StatusOr<std::string> Uppercase(std::string_view s);

}  // namespace offloadd::text
