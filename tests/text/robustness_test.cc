// Randomised robustness: arbitrary input to the tokenizer, the Jinja engine and the record
// encoder must give a result or a clear error, never a crash (run under ASan/UBSan too).
// Deterministic seeds, bounded sizes.

#include <gtest/gtest.h>

#include <random>

#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/jinja.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace offloadd::text {
namespace {

std::string RandomText(std::mt19937& rng, size_t max_len, bool valid_utf8) {
  static const std::vector<std::string> kPieces = {
      "a",    "b",    "ab",           " ",  "  ",  "\n", "\t",   "<eos>",    "<L>",   "<R>", "é",
      "日本", "🤗", "\xE2\x96\x81", "'s", "123", "!?", "\r\n", "\xC2\xA0", "<0x41>"};
  std::string s;
  const size_t n = rng() % max_len;
  for (size_t i = 0; i < n; ++i) {
    if (!valid_utf8 && rng() % 8 == 0) {
      s.push_back(static_cast<char>(rng() & 0xFF));
    } else {
      s += kPieces[rng() % kPieces.size()];
    }
  }
  return s;
}

std::unique_ptr<Tokenizer> Load(const char* json) {
  auto t = Tokenizer::FromJson(json);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

constexpr const char* kByteLevel = R"({
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3, "Ġa": 4},
            "merges": ["a b", "Ġ a"]},
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true},
  "decoder": {"type": "ByteLevel"},
  "added_tokens": [{"id": 5, "content": "<eos>", "special": true, "normalized": false},
                   {"id": 6, "content": "<L>", "lstrip": true, "rstrip": true, "normalized": true}]
})";

constexpr const char* kSentencePiece = R"({
  "model": {"type": "BPE", "vocab": {"<unk>": 0, "▁": 1, "a": 2, "▁a": 3, "<0x41>": 4, "<0xC3>": 5},
            "merges": ["▁ a"], "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>"},
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Prepend",
                 "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"},
              "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
              {"type": "Strip", "content": " ", "start": 1, "stop": 1}]},
  "added_tokens": [{"id": 6, "content": "<R>", "rstrip": true, "normalized": true, "special": true}]
})";

TEST(Robustness, TokenizersNeverCrashOnRandomInput) {
  std::mt19937 rng(1234);
  for (const char* json : {kByteLevel, kSentencePiece}) {
    auto tok = Load(json);
    ASSERT_NE(tok, nullptr);
    for (int i = 0; i < 2000; ++i) {
      const bool valid = i % 2 == 0;
      const std::string text = RandomText(rng, 40, valid);
      auto enc = tok->EncodeWithOffsets(text, i % 3 == 0);
      if (IsValidUtf8(text)) {
        ASSERT_TRUE(enc.ok()) << enc.status().ToString();
        ASSERT_EQ(enc->ids.size(), enc->starts.size());
        for (uint32_t s : enc->starts) ASSERT_LE(s, text.size());
      } else {
        ASSERT_FALSE(enc.ok());
      }
      std::vector<int32_t> ids;
      for (int k = rng() % 12; k > 0; --k) ids.push_back(static_cast<int32_t>(rng() % 12) - 2);
      auto dec = tok->Decode(ids, i % 2 == 0);
      ASSERT_TRUE(dec.ok());
      ASSERT_TRUE(IsValidUtf8(*dec));
    }
  }
}

TEST(Robustness, JinjaNeverCrashesOnRandomTemplates) {
  static const std::vector<std::string> kPieces = {"{{",
                                                   "}}",
                                                   "{%",
                                                   "%}",
                                                   "{#",
                                                   "#}",
                                                   "-",
                                                   " ",
                                                   "x",
                                                   "xs",
                                                   "if",
                                                   "for",
                                                   "in",
                                                   "endif",
                                                   "endfor",
                                                   "set",
                                                   "=",
                                                   "(",
                                                   ")",
                                                   "[",
                                                   "]",
                                                   "{",
                                                   "}",
                                                   ".",
                                                   ",",
                                                   ":",
                                                   "|",
                                                   "trim",
                                                   "length",
                                                   "'s'",
                                                   "\"",
                                                   "1",
                                                   "2.5",
                                                   "+",
                                                   "~",
                                                   "*",
                                                   "/",
                                                   "//",
                                                   "%",
                                                   "not",
                                                   "and",
                                                   "or",
                                                   "is",
                                                   "defined",
                                                   "none",
                                                   "loop",
                                                   "index",
                                                   "else",
                                                   "elif",
                                                   "macro",
                                                   "endmacro",
                                                   "namespace",
                                                   "raise_exception",
                                                   "\n"};
  std::mt19937 rng(99);
  const jinja::Value ctx = jinja::Value::FromJson(
      nlohmann::ordered_json::parse(R"({"x": "abc", "xs": [1, "b", {"k": [2]}], "n": 0})"));
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string src;
    for (int k = rng() % 24; k > 0; --k) src += kPieces[rng() % kPieces.size()];
    auto t = jinja::Template::Parse(src);
    if (!t.ok()) continue;
    ++parsed;
    (void)t->Render(ctx);
  }
  EXPECT_GT(parsed, 100);  // the generator does reach the evaluator
}

TEST(Robustness, RecordEncoderRejectsOddRecordsCleanly) {
  auto tok = Load(kByteLevel);
  ASSERT_NE(tok, nullptr);
  SpecialTokens tokens;
  tokens.eos_token = "<eos>";
  ChatTemplate tmpl = ChatTemplate::BuiltIn(tokens);
  auto enc = RecordEncoder::Create(*tok, &tmpl, DatasetOptions{});
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  for (const char* rec :
       {R"({"messages": [{"role": "user", "content": 5}]})",
        R"({"messages": [{"role": "robot", "content": "x"}]})", R"({"messages": "nope"})",
        R"({"conversations": "nope"})", R"({"conversations": [{"from": "human"}]})",
        R"({"instruction": 1, "output": "x"})",
        R"({"instruction": "a", "output": "b", "history": [["only one"]]})",
        R"({"prompt": "a", "completion": null})", R"({"text": ["a"]})", R"({"input_ids": "1 2"})",
        R"({"input_ids": [1.5]})",
        R"({"messages": [{"role": "user", "content": "a"}], "tools": "{not json"})"}) {
    auto doc = enc->Encode(nlohmann::ordered_json::parse(rec));
    EXPECT_FALSE(doc.ok()) << rec;
    if (!doc.ok()) {
      EXPECT_FALSE(doc.status().message().empty());
    }
  }
}

}  // namespace
}  // namespace offloadd::text
