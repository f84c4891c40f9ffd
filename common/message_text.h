#pragma once
// Text from users' files and requests on its way into error messages, logs and protobuf string
// fields: protobuf strings must be valid UTF-8 (an invalid byte made the Python SDK fail to parse
// the error), and a megabyte-long value echoed into a message hides the message itself.
// Thread-safe: pure functions.

#include <cstddef>
#include <string>
#include <string_view>

namespace offloadd {

// Valid UTF-8 copy of `text`: invalid bytes and control characters other than \n and \t become
// "\xNN"; when longer than `max_bytes`, cut at a character boundary and marked
// "... [N bytes in all]".
std::string SafeMessageText(std::string_view text, size_t max_bytes = 2048);

// Length of the valid UTF-8 sequence starting at s[i] (1 to 4), or 0 when it is not valid
// (overlong forms, surrogates and code points above U+10FFFF are invalid).
size_t Utf8SequenceLength(std::string_view s, size_t i);

// Offset of the first byte of `s` that does not start a valid UTF-8 sequence, or npos.
size_t InvalidUtf8At(std::string_view s);

}  // namespace offloadd
