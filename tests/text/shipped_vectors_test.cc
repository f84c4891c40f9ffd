// The native tokenizer against the test vectors shipped in ../shared/data/tokenizers/test_vectors
// (produced by the Python libraries; see their PROVENANCE.md). Skips when shared/ is absent.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace offloadd::text {
namespace {

std::filesystem::path TokenizersDir() {
  const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
  return std::filesystem::path(src != nullptr ? src : ".") / ".." / "shared" / "data" /
         "tokenizers";
}

nlohmann::json ReadJson(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in, nullptr, false);
}

void CheckParagraph(const char* tokenizer, const char* vectors) {
  const auto dir = TokenizersDir();
  if (!std::filesystem::exists(dir / "test_vectors" / vectors)) {
    GTEST_SKIP() << "shared data not found at " << dir;
  }
  auto tok = Tokenizer::FromFile((dir / tokenizer / "tokenizer.json").string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const nlohmann::json v = ReadJson(dir / "test_vectors" / vectors);
  ASSERT_TRUE(v.is_object());
  auto ids = (*tok)->Encode(v["text"].get<std::string>(), true);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(*ids, v["token_ids"].get<std::vector<int32_t>>());
  auto text = (*tok)->Decode(*ids, true);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, v["text"].get<std::string>());
}

TEST(ShippedVectors, Gpt2Paragraph) { CheckParagraph("gpt2", "gpt2_encoded_tokens.json"); }
TEST(ShippedVectors, Llama2Paragraph) { CheckParagraph("llama2", "llama_encoded.json"); }

TEST(ShippedVectors, MultilingualConformance) {
  const auto dir = TokenizersDir() / "test_vectors" / "multilingual_conformance";
  if (!std::filesystem::exists(dir / "inputs.json")) GTEST_SKIP() << "shared data not found";
  std::map<std::string, std::string> inputs;
  const nlohmann::json cases = ReadJson(dir / "inputs.json");
  for (const auto& c : cases) inputs[c["id"]] = c["text"];
  for (const auto& [tokenizer, file] : {std::pair{"gpt2", "gpt2_multilingual.json"},
                                        std::pair{"llama2", "tinyllama_multilingual.json"}}) {
    auto tok = Tokenizer::FromFile((TokenizersDir() / tokenizer / "tokenizer.json").string());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    size_t checked = 0;
    const nlohmann::json vectors = ReadJson(dir / file);
    for (const auto& e : vectors["entries"]) {
      auto ids = (*tok)->Encode(inputs.at(e["id"].get<std::string>()), true);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(*ids, e["input_ids"].get<std::vector<int32_t>>()) << tokenizer << " " << e["id"];
      ++checked;
    }
    EXPECT_EQ(checked, inputs.size());
  }
}

}  // namespace
}  // namespace offloadd::text
