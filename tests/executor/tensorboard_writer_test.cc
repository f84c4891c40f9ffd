// TensorBoard event files: TFRecord framing with masked CRC-32C (checked against the values
// TensorFlow's record writer produces), the file_version record first, one Event per AddScalars
// with the tags and step given, and a new file per writer. The Python test
// tests/python/daemon/test_tensorboard_events.py reads a real job's files with TensorBoard's
// reader.
#include "executor/tensorboard_writer.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/file.h"
#include "common/safe_path.h"
#include "offloadd/internal/tensorboard.pb.h"

namespace offloadd::executor {
namespace {

namespace tb = offloadd::tensorboard;

uint64_t Le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

// Splits a TFRecord file into its records, checking both checksums of each.
std::vector<std::string> Records(const std::string& file) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < file.size()) {
    EXPECT_GE(file.size() - at, 16u);
    const uint64_t n = Le(file, at, 8);
    EXPECT_EQ(Le(file, at + 8, 4), MaskedCrc32c(file.substr(at, 8)));
    const std::string data = file.substr(at + 12, n);
    EXPECT_EQ(Le(file, at + 12 + n, 4), MaskedCrc32c(data));
    out.push_back(data);
    at += 16 + n;
  }
  return out;
}

std::vector<std::string> EventFiles(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "events.out.tfevents.", 20) == 0)
      out.push_back(dir + "/" + e->d_name);
  }
  ::closedir(d);
  return out;
}

class TensorBoardWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_tb_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }
  std::string dir_;
};

TEST(MaskedCrc32cTest, MatchesTensorFlowsRecordWriter) {
  // tf.io.TFRecordWriter / tensorboard's crc32c.masked_crc32c on the same bytes.
  EXPECT_EQ(MaskedCrc32c(""), 0xa282ead8u);
  EXPECT_EQ(MaskedCrc32c("123456789"), ((0xE3069283u >> 15) | (0xE3069283u << 17)) + 0xa282ead8u);
  // The header of a 24-byte record: length 24 as uint64 little-endian.
  const std::string len("\x18\0\0\0\0\0\0\0", 8);
  const std::string framed = FrameRecord(std::string(24, 'x'));
  EXPECT_EQ(framed.size(), 24u + 16u);
  EXPECT_EQ(framed.substr(0, 8), len);
  EXPECT_EQ(Le(framed, 8, 4), MaskedCrc32c(len));
}

TEST_F(TensorBoardWriterTest, WritesTheVersionThenOneEventPerCall) {
  auto w = EventFileWriter::Create(dir_ + "/runs");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(
      (*w)->AddScalars(3, {{"train/loss", 2.5}, {"train/learning_rate", 1e-4}}, 1700000000.25)
          .ok());
  ASSERT_TRUE((*w)->AddScalars(4, {{"eval/loss", 2.0}}, 1700000001.5).ok());
  // Written through: the file holds every record before the writer is gone.
  auto text = ReadFileConfined((*w)->path());
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const std::vector<std::string> records = Records(*text);
  ASSERT_EQ(records.size(), 3u);
  tb::Event e;
  ASSERT_TRUE(e.ParseFromString(records[0]));
  EXPECT_EQ(e.file_version(), "brain.Event:2");
  ASSERT_TRUE(e.ParseFromString(records[1]));
  EXPECT_EQ(e.step(), 3);
  EXPECT_DOUBLE_EQ(e.wall_time(), 1700000000.25);
  ASSERT_EQ(e.summary().value_size(), 2);
  EXPECT_EQ(e.summary().value(0).tag(), "train/loss");
  EXPECT_EQ(e.summary().value(0).simple_value(), 2.5f);
  EXPECT_EQ(e.summary().value(1).tag(), "train/learning_rate");
  EXPECT_EQ(e.summary().value(1).simple_value(), 1e-4f);
  ASSERT_TRUE(e.ParseFromString(records[2]));
  EXPECT_EQ(e.step(), 4);
  EXPECT_EQ(e.summary().value(0).tag(), "eval/loss");
}

TEST_F(TensorBoardWriterTest, EachWriterStartsANewFile) {
  for (int i = 0; i < 2; ++i) {
    auto w = EventFileWriter::Create(dir_);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    ASSERT_TRUE((*w)->AddScalars(i, {{"train/loss", 1.0}}, WallTimeNow()).ok());
  }
  EXPECT_EQ(EventFiles(dir_).size(), 2u);
}

TEST_F(TensorBoardWriterTest, AnUnwritableDirectoryIsAnErrorNamingIt) {
  const std::string file = dir_ + "/not_a_dir";
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  auto w = EventFileWriter::Create(file + "/runs");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("not_a_dir"), std::string::npos) << w.status().ToString();
}

TEST(StepScalarsTest, TagsAsTransformersAndAuxOnlyWhenPresent) {
  trainer::StepStats s;
  s.loss = 3.0;
  s.learning_rate = 1e-3;
  s.grad_norm = 0.5;
  s.tokens = 1000;
  s.step_seconds = 2.0;
  auto v = StepScalars(s);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].first, "train/loss");
  EXPECT_EQ(v[3].first, "train/tokens_per_second");
  EXPECT_DOUBLE_EQ(v[3].second, 500.0);
  s.aux_loss = 0.01;
  v = StepScalars(s);
  ASSERT_EQ(v.size(), 5u);
  EXPECT_EQ(v[4].first, "train/aux_loss");
}

}  // namespace
}  // namespace offloadd::executor
