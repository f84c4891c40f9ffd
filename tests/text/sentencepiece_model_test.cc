// A model directory with only a SentencePiece tokenizer.model, read through libsentencepiece
// (text/sentencepiece_model.h). Expected ids and offsets are those of the `tokenizers` library on
// the tokenizer.json transformers converted from the same file (shared/data PROVENANCE.md);
// tests/python/text/test_sentencepiece_model.py checks thousands of records the same way.

#include "text/sentencepiece_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace offloadd::text {
namespace {

namespace fs = std::filesystem;

fs::path TokenizersDir() {
  const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
  return fs::path(src != nullptr ? src : ".") / ".." / "shared" / "data" / "tokenizers";
}

// Sanitizer builds do not read tokenizer.model (the shim needs RTLD_DEEPBIND, which the
// sanitizer runtimes refuse; sentencepiece_model.cc says so in its error).
bool SanitizerBuildRefusal(const Status& st) {
  return st.message().find("sanitizer builds") != std::string::npos;
}

class SentencePieceDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("offloadd_spm_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // dir_ with NAME's tokenizer.model (and the config given), or false when shared/ is absent.
  bool ModelOnly(const char* name, const std::string& config = "") {
    const fs::path model = TokenizersDir() / name / "tokenizer.model";
    if (!fs::exists(model)) return false;
    fs::copy_file(model, dir_ / "tokenizer.model", fs::copy_options::overwrite_existing);
    if (!config.empty()) std::ofstream(dir_ / "tokenizer_config.json") << config;
    return true;
  }
  fs::path dir_;
};

TEST_F(SentencePieceDirTest, MistralV3WithItsNonLegacyConfig) {
  if (!ModelOnly("mistral-7b-v0.3", R"({"legacy": false, "add_bos_token": true})")) {
    GTEST_SKIP() << "shared data not found at " << TokenizersDir();
  }
  auto tok = Tokenizer::FromDirectory(dir_.string());
  if (!tok.ok() && SanitizerBuildRefusal(tok.status())) GTEST_SKIP() << tok.status().ToString();
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 32768);
  const std::string text = "[INST] What is the capital of France?[/INST]";
  auto e = (*tok)->EncodeWithOffsets(text, /*add_special_tokens=*/true);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->ids, (std::vector<int32_t>{1, 3, 2592, 1117, 1040, 6333, 1070, 5611, 29572, 4}));
  EXPECT_EQ(e->starts, (std::vector<uint32_t>{0, 0, 6, 11, 14, 18, 26, 29, 36, 37}));
  EXPECT_TRUE((*tok)->IsSpecial(3));
  EXPECT_EQ((*tok)->TokenToId("[INST]"), 3);
  EXPECT_EQ((*tok)->IdToToken(2592), "\xE2\x96\x81What");
  auto text_back = (*tok)->Decode(e->ids, /*skip_special_tokens=*/false);
  ASSERT_TRUE(text_back.ok());
  EXPECT_EQ(*text_back, "<s>[INST] What is the capital of France?[/INST]");
  EXPECT_EQ(*(*tok)->Decode(e->ids, /*skip_special_tokens=*/true),
            "What is the capital of France?");
}

TEST_F(SentencePieceDirTest, Llama2WithoutConfigIsLegacyWithBos) {
  if (!ModelOnly("llama2")) GTEST_SKIP() << "shared data not found at " << TokenizersDir();
  auto tok = Tokenizer::FromDirectory(dir_.string());
  if (!tok.ok() && SanitizerBuildRefusal(tok.status())) GTEST_SKIP() << tok.status().ToString();
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // sentencepiece 0.2.3: "Hello world" -> [15043, 3186], " Hello" -> [29871, 15043].
  EXPECT_EQ(*(*tok)->Encode("Hello world", true), (std::vector<int32_t>{1, 15043, 3186}));
  EXPECT_EQ(*(*tok)->Encode(" Hello", false), (std::vector<int32_t>{29871, 15043}));
}

TEST_F(SentencePieceDirTest, NotAModelOrABadConfigIsRefusedByName) {
  std::ofstream(dir_ / "tokenizer.model") << "\x01not a ModelProto";
  auto bad = Tokenizer::FromDirectory(dir_.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer.model"), std::string::npos)
      << bad.status().ToString();
  if (!ModelOnly("llama2", R"({"legacy": "yes"})")) GTEST_SKIP() << "shared data not found";
  auto config = Tokenizer::FromDirectory(dir_.string());
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.status().message().find("legacy must be true or false"), std::string::npos)
      << config.status().ToString();
}

}  // namespace
}  // namespace offloadd::text
