// Added tokens and the per-segment pipeline, as the Python `tokenizers` library runs it: the text
// is split around added tokens first and every other segment is normalized and pre-tokenized on
// its own. Expected ids were produced by `tokenizers` 0.23 on the same toy tokenizer.json.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/onig_compat.h"
#include "text/regex.h"
#include "text/tokenizer.h"

namespace offloadd::text {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

// SentencePiece-style toy: Prepend("▁") + Replace(" " -> "▁") like Llama-2 and Phi-3.
json ToySentencePiece() {
  return json::parse(R"({
    "normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "▁"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true,
              "vocab": {"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁a": 4, "▁b": 5, "ab": 6, "▁ab": 7},
              "merges": ["a b", "▁ ab", "▁ a", "▁ b"]},
    "added_tokens": [
      {"id": 8, "content": "<u>", "rstrip": true, "normalized": false, "special": true},
      {"id": 9, "content": "<n>", "normalized": true},
      {"id": 10, "content": "\n\n", "normalized": false},
      {"id": 11, "content": "<L>", "lstrip": true, "normalized": false}]
  })");
}

std::unique_ptr<Tokenizer> Load(const json& j) {
  auto t = Tokenizer::FromJson(j.dump());
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

Ids Encode(const Tokenizer& t, std::string_view s) {
  auto ids = t.Encode(s, false);
  EXPECT_TRUE(ids.ok()) << ids.status().ToString();
  return ids.ok() ? *ids : Ids{};
}

TEST(PerSegmentNormalizer, PrependAppliesToEverySegmentBetweenAddedTokens) {
  auto t = Load(ToySentencePiece());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Encode(*t, "ab<u>ab"), (Ids{7, 8, 7}));  // "▁ab" after the token too
  EXPECT_EQ(Encode(*t, "<u>\nab"), (Ids{8, 7}));     // rstrip takes "\n"; "ab" -> "▁ab"
  EXPECT_EQ(Encode(*t, "<u>"), (Ids{8}));
  EXPECT_EQ(Encode(*t, ""), (Ids{}));
}

TEST(PerSegmentNormalizer, NormalizedAddedTokensMatchTheNormalizedText) {
  auto t = Load(ToySentencePiece());
  ASSERT_NE(t, nullptr);
  // "<n>" is searched for as "▁<n>", its normalized form: only where the segment's own "▁" or a
  // space precedes it.
  EXPECT_EQ(Encode(*t, "<n>ab"), (Ids{9, 6}));
  EXPECT_EQ(Encode(*t, "ab <n>"), (Ids{7, 9}));
  EXPECT_EQ(Encode(*t, "ab<n>"), (Ids{7, 0}));  // not found: <, n, > are one fused <unk>
}

TEST(PerSegmentNormalizer, MatchesInsideAnRstripRunStillCount) {
  auto t = Load(ToySentencePiece());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Encode(*t, "<u>\n\nab"), (Ids{8, 10, 7}));
  EXPECT_EQ(Encode(*t, "<u>\n\n<L>ab"), (Ids{8, 10, 11, 7}));
  EXPECT_EQ(Encode(*t, "ab \n\n<L>b"), (Ids{7, 1, 10, 11, 5}));
  EXPECT_EQ(Encode(*t, "a<u> \n\n"), (Ids{4, 8, 10}));
}

TEST(PerSegmentNormalizer, MetaspaceFirstPrependsOnlyAtTheStartOfTheInput) {
  json j = ToySentencePiece();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = json::parse(
      R"({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false})");
  auto t = Load(j);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Encode(*t, "ab<u>ab"), (Ids{7, 8, 6}));
  EXPECT_EQ(Encode(*t, "<u>ab"), (Ids{8, 6}));
  EXPECT_EQ(Encode(*t, "ab ab<u>a b"), (Ids{7, 7, 8, 2, 5}));
  EXPECT_EQ(Encode(*t, " ab"), (Ids{7}));
}

std::filesystem::path Phi3Dir() {
  const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
  return std::filesystem::path(src != nullptr ? src : ".") / ".." / "shared" / "data" /
         "tokenizers" / "phi3-mini";
}

TEST(PerSegmentNormalizer, Phi3DirectoryBeginsEachTurnWithTheSpacePrefixedWord) {
  const auto dir = Phi3Dir();
  if (!std::filesystem::exists(dir / "tokenizer.json")) {
    GTEST_SKIP() << "shared data not found at " << dir;
  }
  auto tok = Tokenizer::FromDirectory(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // `tokenizers` on tokenizer.json: "<|user|>\n" (rstrip), then "▁Can" = 1815, not "Can" = 6028.
  EXPECT_EQ(Encode(**tok, "<|user|>\nCan brain cells move?"),
            (Ids{32010, 1815, 17294, 9101, 4337, 29973}));

  // add_prefix_space in the config asks for transformers' rebuilt Metaspace pipeline.
  const auto tmp =
      std::filesystem::temp_directory_path() / ("offloadd_phi3_" + std::to_string(::getpid()));
  std::filesystem::create_directories(tmp);
  std::filesystem::copy_file(dir / "tokenizer.json", tmp / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(tmp / "tokenizer_config.json")
      << R"({"tokenizer_class": "LlamaTokenizer", "add_prefix_space": true, "legacy": false,
             "add_bos_token": false})";
  auto rebuilt = Tokenizer::FromDirectory(tmp.string());
  std::filesystem::remove_all(tmp);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
  EXPECT_EQ(Encode(**rebuilt, "<|user|>\nCan")[1], 6028);
}

std::vector<std::pair<size_t, size_t>> Find(std::string_view pattern, std::string_view s) {
  auto re = Regex::Compile(pattern);
  EXPECT_TRUE(re.ok()) << re.status().ToString();
  std::vector<std::pair<size_t, size_t>> m;
  if (re.ok()) {
    EXPECT_TRUE((*re)->FindAll(s, &m).ok());
  }
  return m;
}

TEST(OnigCompat, ClassesMeanWhatOnigurumaMeans) {
  // U+180E is not White_Space (Unicode 6.3+), so " \u180E" is one punctuation-like piece.
  EXPECT_EQ(Find(R"(\s+)", "a\xE1\xA0\x8E b").size(), 1u);
  EXPECT_EQ(Find(R"( ?[^\s\p{L}\p{N}]+)",
                 "a \xE1\xA0\x8E"
                 "b"),
            (std::vector<std::pair<size_t, size_t>>{{1, 5}}));
  EXPECT_EQ(Find(R"(\S+)", "\xE1\xA0\x8E").size(), 1u);
  // U+1C89 CYRILLIC CAPITAL LETTER TJE (Unicode 16) is a letter; U+10D40 GARAY DIGIT ZERO a digit.
  EXPECT_EQ(Find(R"(\p{L}+)",
                 "a\xE1\xB2\x89"
                 "b"),
            (std::vector<std::pair<size_t, size_t>>{{0, 5}}));
  EXPECT_EQ(Find(R"([\p{N}]+)", "\xF0\x90\xB5\x80").size(), 1u);
  EXPECT_EQ(Find(R"(\h+)", "0x1F zz").size(), 2u);  // Ruby syntax: hex digits
  EXPECT_EQ(OnigToPcre2(R"([\]\[:alpha:]\\])"), R"([\]\[:alpha:]\\])");
  EXPECT_EQ(OnigToPcre2(R"(\Q\s\E)"), R"(\Q\s\E)");
}

}  // namespace
}  // namespace offloadd::text
