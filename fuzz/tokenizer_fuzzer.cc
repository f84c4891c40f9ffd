// Fuzzes the tokenizer.json loader and, for files that load, the encode/decode pipeline built
// from them (normalizers, pre-tokenizers, BPE merges, added tokens, post-processors, decoders).
// Input: tokenizer.json text, optionally followed by a NUL byte and a text to encode; a few fixed
// texts (ASCII, multi-byte UTF-8, whitespace runs, special-token look-alikes) are encoded too.
// Checked: encoded ids lie in [0, vocab_size) and offsets are non-decreasing and inside the text.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

using offloadd::text::Tokenizer;

namespace {

void EncodeAndCheck(const Tokenizer& tok, std::string_view text, bool special) {
  auto enc = tok.EncodeWithOffsets(text, special);
  if (!enc.ok()) return;
  FUZZ_CHECK(enc->ids.size() == enc->starts.size());
  for (size_t i = 0; i < enc->ids.size(); ++i) {
    FUZZ_CHECK(enc->ids[i] >= 0 && enc->ids[i] < tok.vocab_size());
    FUZZ_CHECK(enc->starts[i] <= text.size());
  }
  auto ids = tok.Encode(text, special);
  FUZZ_CHECK(ids.ok() && *ids == enc->ids);
  (void)tok.Decode(enc->ids, /*skip_special_tokens=*/false);
  (void)tok.Decode(enc->ids, /*skip_special_tokens=*/true);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view all = offloadd::fuzz::AsText(data, size);
  const size_t nul = all.find('\0');
  std::string_view json = all.substr(0, nul);
  std::string_view text = nul == std::string_view::npos ? std::string_view() : all.substr(nul + 1);

  auto tok = Tokenizer::FromJson(json, "tokenizer.json");
  if (!tok.ok()) return 0;
  const Tokenizer& t = **tok;
  FUZZ_CHECK(t.vocab_size() >= 0);
  static constexpr std::string_view kTexts[] = {
      "Hello world! It's 2024.", "  leading and   inner  spaces\n\n\ttabs",
      "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80", "<s>[INST] <unk></s><|endoftext|>",
      "", "a"};
  for (std::string_view s : kTexts) EncodeAndCheck(t, s, true);
  EncodeAndCheck(t, text, true);
  EncodeAndCheck(t, text, false);
  // Arbitrary ids, including unknown and negative ones, must decode without harm.
  const int32_t ids[] = {0, 1, -1, t.vocab_size(), t.vocab_size() - 1, 1 << 30};
  (void)t.Decode(ids, false);
  (void)t.Decode(ids, true);
  for (int32_t id : ids) {
    if (auto s = t.IdToToken(id)) (void)t.TokenToId(*s);
  }
  return 0;
}
