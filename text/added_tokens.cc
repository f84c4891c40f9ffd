#include "text/added_tokens.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "text/tokenizer.h"
#include "text/unicode.h"

namespace offloadd::text {

namespace {

// Regex \w as the `regex` crate defines it.
bool IsWordChar(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  const int8_t cat = u_charType(c);
  return cat == U_NON_SPACING_MARK || cat == U_ENCLOSING_MARK || cat == U_COMBINING_SPACING_MARK ||
         cat == U_DECIMAL_DIGIT_NUMBER || cat == U_CONNECTOR_PUNCTUATION;
}

uint32_t LastCodePoint(std::string_view s, size_t end, size_t* begin) {
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;
  *begin = b;
  size_t p = b;
  return NextCodePoint(s, &p);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<Pattern> patterns)
    : patterns_(std::move(patterns)) {
  terminal_.push_back(-1);
  for (size_t i = 0; i < patterns_.size(); ++i) {
    const std::string& p = patterns_[i].text;
    if (p.empty()) continue;
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    int32_t node = 0;
    for (unsigned char b : p) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | b;
      auto it = edges_.find(key);
      if (it == edges_.end()) {
        terminal_.push_back(-1);
        it = edges_.emplace(key, static_cast<int32_t>(terminal_.size() - 1)).first;
      }
      node = it->second;
    }
    if (terminal_[node] < 0) terminal_[node] = static_cast<int32_t>(i);  // first pattern wins
  }
}

int AddedTokenMatcher::LongestAt(std::string_view s, size_t pos, size_t* end) const {
  int best = -1;
  int32_t node = 0;
  for (size_t i = pos; i < s.size(); ++i) {
    auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(s[i]));
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) {
      best = terminal_[node];
      *end = i + 1;
    }
  }
  return best;
}

std::vector<AddedTokenMatcher::Piece> AddedTokenMatcher::Split(std::string_view s) const {
  std::vector<Piece> out;
  size_t start_offset = 0;  // where the next plain piece begins
  size_t pos = 0;           // where the scan resumes
  while (pos < s.size() && !patterns_.empty()) {
    if (!first_byte_[static_cast<unsigned char>(s[pos])]) {
      ++pos;
      continue;
    }
    size_t stop = 0;
    const int idx = LongestAt(s, pos, &stop);
    if (idx < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    pos = stop;  // the scan continues after the raw match whatever happens below
    const AddedToken* tok = patterns_[idx].token;
    if (tok->single_word) {
      size_t b = 0;
      const bool start_space = start == 0 || !IsWordChar(LastCodePoint(s, start, &b));
      size_t p = stop;
      const bool stop_space = stop == s.size() || !IsWordChar(NextCodePoint(s, &p));
      if (!start_space || !stop_space) continue;
    }
    // A match may begin inside whitespace that the previous token's rstrip took (a token such
    // as "\n\n" after an rstrip token): `tokenizers` still emits it, overlapping, and resumes
    // after it, so the same is done here.
    if (tok->lstrip) {
      while (start > start_offset) {
        size_t b = 0;
        if (!IsUnicodeWhitespace(LastCodePoint(s, start, &b))) break;
        start = b;
      }
      start = std::max(start, start_offset);
    }
    if (tok->rstrip) {
      while (stop < s.size()) {
        size_t p = stop;
        if (!IsUnicodeWhitespace(NextCodePoint(s, &p))) break;
        stop = p;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, nullptr});
    if (start < stop) out.push_back({start, stop, tok});  // empty pieces are dropped
    start_offset = stop;
  }
  if (start_offset < s.size() || s.empty()) out.push_back({start_offset, s.size(), nullptr});
  return out;
}

}  // namespace offloadd::text
