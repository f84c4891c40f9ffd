// gzip-compressed datasets: the same records as the plain file, streamed in pieces; truncated and
// corrupt streams refused naming the file.

#include "text/gzip_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/common/gzip_test_util.h"
#include "tests/text/toy_tokenizer.h"
#include "text/batcher.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace offloadd::text {
namespace {

std::string TempDir() {
  auto dir = std::filesystem::temp_directory_path() /
             ("offloadd_gzip_" + std::to_string(::getpid()) + "_" +
              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::create_directories(dir);
  return dir.string();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

using test_util::Gzip;

using test_util::ToyTokenizer;

// ~2.4 MB of JSON Lines (more than two of the reader's 1 MiB pieces), blank lines and CRLF among
// them, records of varying length so that lines straddle the pieces.
std::string ManyRecords() {
  std::string s;
  for (int i = 0; i < 6000; ++i) {
    std::string text;
    for (int k = 0; k < 20 + (i * 37) % 400; ++k) text += "ab "[(i + k) % 3];
    s += R"({"text": ")" + text + "\"}" + (i % 7 == 0 ? "\r\n" : "\n");
    if (i % 500 == 0) s += "\n   \n";
  }
  return s;
}

TEST(GzipReader, InflatesConcatenatedMembersInSmallPieces) {
  const std::string dir = TempDir();
  const std::string a = ManyRecords(), b = "{\"text\": \"tail\"}\n";
  WriteFile(dir + "/two.gz", Gzip(a) + Gzip(b));
  const int fd = ::open((dir + "/two.gz").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  auto magic = IsGzipFile(fd, dir + "/two.gz");
  ASSERT_TRUE(magic.ok() && *magic);
  auto gz = GzipReader::Open(OwnedFd(fd), dir + "/two.gz");
  ASSERT_TRUE(gz.ok()) << gz.status().ToString();
  std::string got;
  char buf[4093];
  for (;;) {
    auto n = (*gz)->Read(buf, sizeof buf);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    if (*n == 0) break;
    got.append(buf, *n);
  }
  EXPECT_EQ(got, a + b);
  EXPECT_EQ((*gz)->decompressed_bytes(), got.size());
  EXPECT_FALSE(HasGzipMagic("{\"text\""));
}

TEST(GzipReader, SameRecordsAndBatchesAsThePlainFile) {
  const std::string dir = TempDir();
  const std::string text = ManyRecords();
  WriteFile(dir + "/d.jsonl", text);
  WriteFile(dir + "/d.jsonl.gz", Gzip(text));
  // A JSON array too: read whole once inflated.
  const std::string array = "[\n  {\"text\": \"ab\"},\n  {\"text\": \"b a\"}\n]\n";
  WriteFile(dir + "/a.json", array);
  WriteFile(dir + "/a.json.gz", Gzip(array));
  auto tok = ToyTokenizer();
  auto plain = DatasetReader::Load({dir + "/d.jsonl", dir + "/a.json"}, *tok, nullptr, {});
  auto gz = DatasetReader::Load({dir + "/d.jsonl.gz", dir + "/a.json.gz"}, *tok, nullptr, {});
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  ASSERT_TRUE(gz.ok()) << gz.status().ToString();
  ASSERT_EQ(plain->size(), 6002u);
  ASSERT_EQ(gz->size(), plain->size());
  EXPECT_EQ(gz->stats().tokens, plain->stats().tokens);
  for (size_t i = 0; i < plain->size(); ++i) {
    ASSERT_EQ(gz->document(i).input_ids, plain->document(i).input_ids) << i;
    ASSERT_EQ(gz->document(i).labels, plain->document(i).labels) << i;
  }
  BatcherOptions o;
  o.max_seq_length = 512;
  o.seed = 7;
  auto bp = Batcher::Create(plain->documents(), o);
  auto bg = Batcher::Create(gz->documents(), o);
  ASSERT_TRUE(bp.ok() && bg.ok());
  for (int step = 0; step < 50; ++step) {
    const PackedSequence p = bp->Next(), g = bg->Next();
    ASSERT_EQ(g.input_ids, p.input_ids) << step;
    ASSERT_EQ(g.labels, p.labels) << step;
    ASSERT_EQ(g.sources, p.sources) << step;
  }
}

TEST(GzipReader, BadRecordNamesTheSameLineAsInThePlainFile) {
  const std::string dir = TempDir();
  std::string text = ManyRecords();
  text += "{\"text\": \"ab\"}\n{\"oops\": 1}\n";
  WriteFile(dir + "/bad.jsonl", text);
  WriteFile(dir + "/bad.jsonl.gz", Gzip(text));
  auto tok = ToyTokenizer();
  auto plain = DatasetReader::Load({dir + "/bad.jsonl"}, *tok, nullptr, {});
  auto gz = DatasetReader::Load({dir + "/bad.jsonl.gz"}, *tok, nullptr, {});
  ASSERT_FALSE(plain.ok());
  ASSERT_FALSE(gz.ok());
  const std::string pm = plain.status().message(), gm = gz.status().message();
  const std::string where = pm.substr(pm.find(".jsonl:") + 6);  // ":LINE: what"
  EXPECT_NE(gm.find(dir + "/bad.jsonl.gz" + where), std::string::npos) << gm << " vs " << pm;
}

TEST(GzipReader, TruncatedAndCorruptStreamsNameTheFile) {
  const std::string dir = TempDir();
  const std::string gz = Gzip(ManyRecords());
  auto tok = ToyTokenizer();
  // Cut in the middle: a clear DATA_LOSS naming the file and how far the records got.
  WriteFile(dir + "/cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  auto cut = DatasetReader::Load({dir + "/cut.jsonl.gz"}, *tok, nullptr, {});
  ASSERT_FALSE(cut.ok());
  EXPECT_EQ(cut.status().code(), StatusCode::kDataLoss) << cut.status().ToString();
  const std::string cm = cut.status().message();
  EXPECT_NE(cm.find(dir + "/cut.jsonl.gz: truncated gzip stream"), std::string::npos) << cm;
  EXPECT_NE(cm.find("(after record "), std::string::npos) << cm;
  // Only the 8-byte trailer missing (CRC and length): still truncated, never silently accepted.
  WriteFile(dir + "/notrailer.jsonl.gz", gz.substr(0, gz.size() - 4));
  auto notrailer = DatasetReader::Load({dir + "/notrailer.jsonl.gz"}, *tok, nullptr, {});
  ASSERT_FALSE(notrailer.ok());
  EXPECT_NE(notrailer.status().message().find("truncated gzip stream"), std::string::npos)
      << notrailer.status().ToString();
  // Flipped bytes in the deflate data, or in the CRC: corrupt, named with zlib's reason. With
  // skip_bad_records, so that records garbled before zlib notices are skipped, not the error.
  DatasetOptions skip;
  skip.skip_bad_records = true;
  for (const size_t at : {gz.size() / 3, gz.size() - 7}) {
    std::string bad = gz;
    for (size_t i = at; i < at + 3; ++i) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    WriteFile(dir + "/bad.jsonl.gz", bad);
    auto r = DatasetReader::Load({dir + "/bad.jsonl.gz"}, *tok, nullptr, skip);
    ASSERT_FALSE(r.ok()) << at;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
    const std::string m = r.status().message();
    EXPECT_NE(m.find(dir + "/bad.jsonl.gz: corrupt gzip data"), std::string::npos) << m;
  }
  // Trailing garbage after a complete member is refused too (not silently dropped).
  WriteFile(dir + "/tail.jsonl.gz", gz + "garbage");
  auto tail = DatasetReader::Load({dir + "/tail.jsonl.gz"}, *tok, nullptr, {});
  ASSERT_FALSE(tail.ok());
  EXPECT_EQ(tail.status().code(), StatusCode::kDataLoss) << tail.status().ToString();
  EXPECT_NE(tail.status().message().find("tail.jsonl.gz: corrupt gzip data"), std::string::npos)
      << tail.status().ToString();
}

}  // namespace
}  // namespace offloadd::text
