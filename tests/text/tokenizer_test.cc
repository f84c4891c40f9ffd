// Unit tests for the tokenizer's pieces on small hand-built tokenizer.json files. Parity with the
// Python `tokenizers` library on real tokenizers lives in tests/python/text/.

#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "text/regex.h"
#include "text/unicode.h"

namespace offloadd::text {
namespace {

using json = nlohmann::json;

// A byte-level tokenizer over the alphabet {a, b, c, Ġ} whose merges make the rank order matter:
// "b c" ranks before "a b", so "abc" must become [a, bc] and then [abc] (via "a bc").
json ToyByteLevel() {
  return json::parse(R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "bc": 4, "ab": 5,
                                       "abc": 6, "Ġa": 7},
              "merges": ["b c", "a b", "a bc", "Ġ a"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "decoder": {"type": "ByteLevel"},
    "added_tokens": [
      {"id": 8, "content": "<eos>", "special": true, "normalized": false},
      {"id": 9, "content": "<L>", "special": false, "normalized": false, "lstrip": true},
      {"id": 10, "content": "<R>", "special": false, "normalized": false, "rstrip": true}]
  })");
}

std::unique_ptr<Tokenizer> Load(const json& j) {
  auto t = Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

std::vector<int32_t> Ids(const Tokenizer& t, std::string_view s, bool special = false) {
  auto ids = t.Encode(s, special);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

// A vocab id far past the entries would size the id table from it: 2^31 strings from a few bytes
// (fuzz regression tokenizer/sparse-vocab-id). Refused, naming the id.
TEST(TokenizerTest, AVocabIdFarBeyondTheEntriesIsRefused) {
  json j = ToyByteLevel();
  j["model"]["vocab"]["Ġa"] = 2147483000;
  auto t = Tokenizer::FromJson(j.dump(), "sparse/tokenizer.json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("id 2147483000 with only 8 entries"), std::string::npos) << t.status().ToString();
  j["model"]["vocab"]["Ġa"] = 100;  // holes a real vocab could have stay accepted
  j["added_tokens"] = json::array();
  EXPECT_TRUE(Tokenizer::FromJson(j.dump()).ok());
}

TEST(ByteLevelTable, IsABijectionOverPrintableCodePoints) {
  std::set<uint32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const uint32_t cp = ByteToCodePoint(static_cast<uint8_t>(b));
    EXPECT_EQ(CodePointToByte(cp), b);
    seen.insert(cp);
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(ByteToCodePoint(' '), 0x120u);  // 'Ġ', as in every GPT-2 vocab
  EXPECT_EQ(ByteToCodePoint('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(CodePointToByte(0x4E00), -1);
}

TEST(Utf8, LossyReplacesMaximalInvalidSubparts) {
  // Examples from the Unicode Standard, section 3.9 ("U+FFFD Substitution of Maximal Subparts").
  EXPECT_EQ(Utf8Lossy("a\xF1\x80\x80"
                      "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Utf8Lossy("\xE1\x80\xE2\xF0\x91\x92\xF1\xBF"
                      "A"),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(Utf8Lossy("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: 2 replacements
  EXPECT_EQ(Utf8Lossy("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(Utf8Lossy("ok \xF0\x9F\xA4\x97"), "ok \xF0\x9F\xA4\x97");
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_TRUE(IsValidUtf8("\xF4\x8F\xBF\xBF"));
}

TEST(Regex, UnicodeClassesWork) {
  auto re = Regex::Compile(R"(\p{L}+|\p{N}+|\s+)");
  ASSERT_TRUE(re.ok()) << re.status().ToString();
  std::vector<std::pair<size_t, size_t>> m;
  ASSERT_TRUE((*re)->FindAll("héllo 日本 ٣٤", &m).ok());
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0], std::make_pair(size_t{0}, size_t{6}));  // "héllo" is one \p{L}+ run
  auto bad = Regex::Compile("(unclosed");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("(unclosed"), std::string::npos);
}

TEST(Bpe, AppliesMergesByRankNotByPosition) {
  auto t = Load(ToyByteLevel());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "abc"), (std::vector<int32_t>{6}));
  EXPECT_EQ(Ids(*t, "ab"), (std::vector<int32_t>{5}));
  EXPECT_EQ(Ids(*t, "cab"), (std::vector<int32_t>{2, 5}));
  EXPECT_EQ(Ids(*t, "bca"), (std::vector<int32_t>{4, 0}));
  EXPECT_EQ(Ids(*t, " a"), (std::vector<int32_t>{7}));  // the space is mapped to Ġ first
  EXPECT_EQ(Ids(*t, ""), (std::vector<int32_t>{}));
  auto text = t->Decode(Ids(*t, "cab abc"), false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "cab abc");
}

TEST(Bpe, MergesAsPairsEqualMergesAsStrings) {
  json j = ToyByteLevel();
  j["model"]["merges"] = json::parse(R"([["b","c"],["a","b"],["a","bc"],["Ġ","a"]])");
  auto pairs = Load(j);
  auto strings = Load(ToyByteLevel());
  ASSERT_NE(pairs, nullptr);
  for (const char* s : {"abc", "cab abc", " a bca", "ccc"})
    EXPECT_EQ(Ids(*pairs, s), Ids(*strings, s));
}

TEST(Bpe, ByteFallbackAndUnknowns) {
  json j = json::parse(R"({"model": {"type": "BPE", "vocab": {"<unk>": 0, "a": 1, "b": 2, "ab": 3,
      "<0xC3>": 4, "<0xA9>": 5}, "merges": ["a b"], "unk_token": "<unk>", "byte_fallback": true,
      "fuse_unk": true}, "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
      {"type": "Fuse"}]}})");
  auto t = Load(j);
  ASSERT_NE(t, nullptr);
  // é = C3 A9 falls back to bytes; x and y have neither a token nor bytes: one fused <unk>.
  EXPECT_EQ(Ids(*t, "abéxyab"), (std::vector<int32_t>{3, 4, 5, 0, 3}));
  auto text = t->Decode(std::vector<int32_t>{3, 4, 5, 3}, false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "ab\xC3\xA9"
            "ab");
  text = t->Decode(std::vector<int32_t>{4, 3}, false);  // a lone lead byte decodes to U+FFFD
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "\xEF\xBF\xBD"
            "ab");
}

TEST(AddedTokens, SplitFirstAndHonourStrip) {
  auto t = Load(ToyByteLevel());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Ids(*t, "ab<eos>ab"), (std::vector<int32_t>{5, 8, 5}));
  EXPECT_EQ(Ids(*t, "ab  <L>"), (std::vector<int32_t>{5, 9}));     // lstrip eats the spaces
  EXPECT_EQ(Ids(*t, "<R>  ab"), (std::vector<int32_t>{10, 5}));    // rstrip eats the spaces
  EXPECT_EQ(Ids(*t, "ab <R>"), (std::vector<int32_t>{5, 3, 10}));  // no lstrip on <R>
  auto with = t->Decode(std::vector<int32_t>{5, 8, 5}, false);
  auto without = t->Decode(std::vector<int32_t>{5, 8, 5}, true);
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_EQ(*with, "ab<eos>ab");
  EXPECT_EQ(*without, "abab");
  EXPECT_TRUE(t->IsSpecial(8));
  EXPECT_FALSE(t->IsSpecial(9));
  EXPECT_EQ(t->vocab_size(), 11);
}

TEST(Offsets, PointAtTheFirstByteOfEachToken) {
  auto t = Load(ToyByteLevel());
  ASSERT_NE(t, nullptr);
  auto e = t->EncodeWithOffsets("cab<eos> abc", false);
  ASSERT_TRUE(e.ok());
  // " abc" -> Ġ a b c -> (b c, rank 0) Ġ a bc -> (a bc, rank 2 beats Ġ a, rank 3) Ġ abc.
  EXPECT_EQ(e->ids, (std::vector<int32_t>{2, 5, 8, 3, 6}));
  EXPECT_EQ(e->starts, (std::vector<uint32_t>{0, 1, 3, 8, 9}));
}

TEST(Tokenizer, RejectsBadFilesWithClearErrors) {
  auto expect_error = [](const json& j, const std::string& needle) {
    auto t = Tokenizer::FromJson(j.dump(), "my/tokenizer.json");
    ASSERT_FALSE(t.ok()) << "accepted: " << j.dump();
    EXPECT_NE(t.status().message().find(needle), std::string::npos) << t.status().ToString();
    EXPECT_NE(t.status().message().find("my/tokenizer.json"), std::string::npos);
  };
  json j = ToyByteLevel();
  j["model"]["merges"] = json::array();
  expect_error(j, "model.merges");
  j = ToyByteLevel();
  j["model"]["merges"].push_back("a zz");
  expect_error(j, "model.merges[4]");
  j = ToyByteLevel();
  j["model"]["merges"].push_back("a b c");
  expect_error(j, "model.merges[4]");
  j = ToyByteLevel();
  j["pre_tokenizer"] = json::parse(R"({"type": "Sequence", "pretokenizers": [
      {"type": "ByteLevel"}, {"type": "Whitespace"}]})");
  expect_error(j, "pre_tokenizer.pretokenizers[1]: unsupported pre-tokenizer type \"Whitespace\"");
  j = ToyByteLevel();
  j["normalizer"] = json::parse(R"({"type": "BertNormalizer"})");
  expect_error(j, "BertNormalizer");
  j = ToyByteLevel();
  j["model"]["type"] = "WordPiece";
  expect_error(j, "WordPiece");
  j = ToyByteLevel();
  j["model"]["dropout"] = 0.1;
  expect_error(j, "dropout");
  j = ToyByteLevel();
  j["pre_tokenizer"] = json::parse(R"({"type": "Split", "pattern": {"Regex": "(["},
      "behavior": "Isolated", "invert": false})");
  expect_error(j, "pre_tokenizer.pattern");

  j = ToyByteLevel();  // a wrongly typed field is an error, not an exception
  j["decoder"] = json::parse(R"({"type": "Strip", "content": " ", "start": "one", "stop": 0})");
  expect_error(j, "my/tokenizer.json");
  j = ToyByteLevel();
  j["added_tokens"][0]["lstrip"] = "yes";
  expect_error(j, "my/tokenizer.json");

  auto bad_json = Tokenizer::FromJson("{\"model\": ", "x.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.status().message().find("x.json: not valid JSON"), std::string::npos);
  auto missing = Tokenizer::FromFile("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST(Tokenizer, RejectsInvalidUtf8Input) {
  auto t = Load(ToyByteLevel());
  ASSERT_NE(t, nullptr);
  auto ids = t->Encode("ab\xFF", false);
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), StatusCode::kInvalidArgument);
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  auto t = Load(ToyByteLevel());
  ASSERT_NE(t, nullptr);
  const std::string text = "abc cab <eos> bca  ab<R> c";
  const auto want = Ids(*t, text);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 200; ++k) {
        auto got = t->Encode(text + std::string(k % 7, 'a'), false);
        if (!got.ok() || (k % 7 == 0 && *got != want)) ++mismatches;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace offloadd::text
