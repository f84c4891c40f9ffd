#pragma once
// Finds added tokens (special tokens such as <s>, <|endoftext|>, <|im_start|>) in text the way
// `tokenizers`' AddedVocabulary does: non-overlapping leftmost-longest matches, scanning on from
// the end of each match; single_word tokens only match between non-word characters; lstrip and
// rstrip widen a match over adjacent Unicode whitespace, which then belongs to the token. As
// there, a match that begins inside whitespace the previous token's rstrip took is still a token
// (the pieces then overlap), and a token piece left empty by lstrip is dropped.
// Immutable after construction; thread-safe.

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace offloadd::text {

struct AddedToken;

class AddedTokenMatcher {
 public:
  struct Pattern {
    std::string text;  // what to search for (the content, normalized for normalized tokens)
    const AddedToken* token;
  };
  explicit AddedTokenMatcher(std::vector<Pattern> patterns);

  // A slice [begin, end) of the input; `token` is null for plain text between tokens.
  struct Piece {
    size_t begin, end;
    const AddedToken* token;
  };
  // Covers all of `s` with plain pieces and token pieces, in order (plain pieces may be empty
  // only when `s` is; token pieces may overlap the one before, see above).
  std::vector<Piece> Split(std::string_view s) const;
  bool empty() const { return patterns_.empty(); }

 private:
  // Longest pattern starting at s[pos], or -1.
  int LongestAt(std::string_view s, size_t pos, size_t* end) const;

  std::vector<Pattern> patterns_;
  // Byte trie: key (node << 8 | byte) -> child node; terminal_[node] = pattern index or -1.
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_;
  bool first_byte_[256] = {};
};

}  // namespace offloadd::text
