#include "engine/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace offloadd::engine {
namespace {

namespace fs = std::filesystem;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("st_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes a raw file: u64 header length + header + data bytes.
  std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                       uint64_t declared_len = UINT64_MAX) {
    std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    uint64_t n = declared_len == UINT64_MAX ? header.size() : declared_len;
    char prefix[8];
    for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out.write(prefix, 8);
    out << header;
    out << std::string(data_bytes, '\0');
    return path;
  }

  // Expects Open to fail with a message that names the file and contains `needle`.
  void ExpectError(const std::string& path, const std::string& needle) {
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << "opened " << path;
    EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().ToString();
    EXPECT_NE(f.status().message().find(needle), std::string::npos) << f.status().ToString();
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, WriteThenReadRoundTrip) {
  std::vector<float> a = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  std::vector<uint16_t> b = {0x3f80, 0x4000};  // bf16 1.0, 2.0
  std::vector<TensorToWrite> ts = {
      {"b.bf16", DType::kBF16, {2}, std::as_bytes(std::span(b))},
      {"a.f32", DType::kF32, {2, 3}, std::as_bytes(std::span(a))},
      {"empty", DType::kF16, {0, 4}, {}},
  };
  const std::string path = (dir_ / "x.safetensors").string();
  ASSERT_TRUE(WriteSafetensors(path, ts, {{"format", "pt"}}).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ((*f)->tensors().size(), 3u);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  const TensorInfo* ai = (*f)->Find("a.f32");
  ASSERT_NE(ai, nullptr);
  EXPECT_EQ(ai->dtype, DType::kF32);
  EXPECT_EQ(ai->shape, (std::vector<int64_t>{2, 3}));
  auto data = (*f)->data(*ai);
  ASSERT_EQ(data.size(), 24u);
  EXPECT_EQ(std::memcmp(data.data(), a.data(), 24), 0);
  const TensorInfo* bi = (*f)->Find("b.bf16");
  ASSERT_NE(bi, nullptr);
  EXPECT_EQ(std::memcmp((*f)->data(*bi).data(), b.data(), 4), 0);
  EXPECT_EQ((*f)->Find("empty")->numel(), 0);
  EXPECT_EQ((*f)->Find("missing"), nullptr);
  // Header is padded to 8 bytes so data is aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);
  // The in-memory encoding is the file's bytes.
  in.seekg(0);
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bytes = EncodeSafetensors(ts, {{"format", "pt"}});
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, file);
  EXPECT_FALSE(EncodeSafetensors({{"a", DType::kF32, {7}, std::as_bytes(std::span(a))}}).ok());
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<float> a = {1.f, 2.f};
  const std::string path = (dir_ / "bad.safetensors").string();
  EXPECT_FALSE(WriteSafetensors(path, {{"a", DType::kF32, {3}, std::as_bytes(std::span(a))}}).ok());
  EXPECT_FALSE(WriteSafetensors(path, {{"a", DType::kF32, {2}, std::as_bytes(std::span(a))},
                                       {"a", DType::kF32, {2}, std::as_bytes(std::span(a))}})
                   .ok());
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, MalformedFilesGiveNamedErrors) {
  ExpectError(WriteRaw("empty_header", "", 0), "does not start with");
  {
    std::string p = (dir_ / "tiny").string();
    std::ofstream(p) << "abc";
    ExpectError(p, "shorter than the 8-byte prefix");
  }
  ExpectError(WriteRaw("huge_len", "{}", 0, 1ull << 40), "exceeds");
  ExpectError(WriteRaw("past_end", "{}", 0, 1000), "past the end");
  ExpectError(WriteRaw("not_json", "{\"a\": ", 0), "not valid JSON");
  ExpectError(WriteRaw("array", "[1,2]", 0), "does not start with '{'");
  ExpectError(WriteRaw("bad_dtype", R"({"a":{"dtype":"F7","shape":[1],"data_offsets":[0,4]}})", 4),
              "unsupported safetensors dtype");
  ExpectError(
      WriteRaw("size_mismatch", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
      "does not match dtype");
  ExpectError(WriteRaw("oob", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
              "past the data buffer");
  ExpectError(
      WriteRaw("begin_gt_end", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 8),
      "begin > end");
  ExpectError(WriteRaw("overlap",
                       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                       8),
              "overlaps");
  ExpectError(WriteRaw("hole", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
              "hole");
  ExpectError(WriteRaw("trailing", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
              "trailing bytes");
  ExpectError(WriteRaw("dup",
                       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                       8),
              "duplicate key \"a\"");
  ExpectError(
      WriteRaw("neg_shape", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
      "negative");
  ExpectError(
      WriteRaw("float_off", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0.0,4]}})", 4),
      "data_offsets");
  ExpectError(
      WriteRaw("overflow",
               R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4),
      "overflows");
  ExpectError(
      WriteRaw("extra_field", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", 4),
      "unknown field");
  ExpectError(WriteRaw("meta", R"({"__metadata__":{"k":1}})", 0), "not a string");
  EXPECT_EQ(SafetensorsFile::Open((dir_ / "absent").string()).status().code(),
            StatusCode::kNotFound);
}

// Random corruption of a valid file (header bytes flipped, truncation, trailing garbage) must
// always give OK or an error, never a crash or an out-of-bounds read (run under ASan to see).
TEST_F(SafetensorsTest, CorruptedFilesNeverCrash) {
  std::vector<float> a(12, 1.5f);
  std::vector<uint16_t> b(5, 7);
  const std::string good = (dir_ / "good.safetensors").string();
  ASSERT_TRUE(
      WriteSafetensors(good, {{"layer.weight", DType::kF32, {3, 4}, std::as_bytes(std::span(a))},
                              {"layer.bias", DType::kBF16, {5}, std::as_bytes(std::span(b))}})
          .ok());
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint32_t state = 12345;
  auto rnd = [&]() { return state = state * 1664525u + 1013904223u; };
  const std::string path = (dir_ / "bad.safetensors").string();
  int ok = 0, errors = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string mutated = bytes;
    switch (iter % 3) {
      case 0:  // flip 1-4 bytes anywhere in the prefix + header
        for (uint32_t k = 0, n = 1 + rnd() % 4; k < n; ++k) {
          mutated[rnd() % std::min<size_t>(mutated.size(), 8 + 200)] ^=
              static_cast<char>(1 + rnd() % 255);
        }
        break;
      case 1:  // truncate
        mutated.resize(rnd() % mutated.size());
        break;
      case 2:  // append garbage
        mutated.append(1 + rnd() % 16, static_cast<char>(rnd()));
        break;
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << mutated;
    auto f = SafetensorsFile::Open(path);
    if (f.ok()) {
      ++ok;
      for (const auto& t : (*f)->tensors()) {
        auto span = (*f)->data(t);
        ASSERT_EQ(span.size(), t.nbytes());
        volatile std::byte sink{};
        for (std::byte x : span) sink = x;  // every byte readable
        (void)sink;
      }
    } else {
      ++errors;
      EXPECT_NE(f.status().message().find(path), std::string::npos) << f.status().ToString();
    }
  }
  EXPECT_GT(errors, 1500);  // nearly every mutation is caught
  EXPECT_GT(ok, 0);         // some flips hit harmless bytes (e.g. inside the padding)
}

TEST_F(SafetensorsTest, ShardedCheckpoint) {
  std::vector<float> a = {1.f}, b = {2.f, 3.f};
  ASSERT_TRUE(WriteSafetensors((dir_ / "s1.safetensors").string(),
                               {{"a", DType::kF32, {1}, std::as_bytes(std::span(a))}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors((dir_ / "s2.safetensors").string(),
                               {{"b", DType::kF32, {2}, std::as_bytes(std::span(b))}})
                  .ok());
  auto write_index = [&](const std::string& body) {
    std::ofstream(dir_ / "model.safetensors.index.json") << body;
  };
  write_index(R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors"}})");
  auto ck = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_TRUE((*ck)->sharded());
  EXPECT_EQ((*ck)->Names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(*(*ck)->ShardOf("b"), "s2.safetensors");
  auto e = (*ck)->Get("b");
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->info->shape, (std::vector<int64_t>{2}));
  EXPECT_EQ((*ck)->Get("zzz").status().code(), StatusCode::kNotFound);

  write_index(R"({"weight_map":{"a":"s2.safetensors","b":"s2.safetensors"}})");
  auto bad = Checkpoint::Open(dir_.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not contain"), std::string::npos);

  write_index(R"({"weight_map":{"a":"../s1.safetensors"}})");
  bad = Checkpoint::Open(dir_.string());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("outside"), std::string::npos);

  write_index(R"({"weight_map":{"a":"s1.safetensors"}})");  // s1 fine, b unlisted but in no shard
  EXPECT_TRUE(Checkpoint::Open(dir_.string()).ok());

  write_index("{not json");
  EXPECT_FALSE(Checkpoint::Open(dir_.string()).ok());
  fs::remove(dir_ / "model.safetensors.index.json");
  EXPECT_EQ(Checkpoint::Open(dir_.string()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace offloadd::engine
