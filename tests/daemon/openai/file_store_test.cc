#include "daemon/openai/file_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "common/file.h"

namespace offloadd::daemon::openai {
namespace {

const std::string kRecord =
    R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},)"
    R"( {"role": "assistant", "content": "Hello."}]})";

TEST(ChatJsonlTest, CountsRecordsAndSkipsBlankLines) {
  auto n = CheckChatJsonl(kRecord + "\n\n" + kRecord + "\r\n" + kRecord);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 3);
}

TEST(ChatJsonlTest, BadLinesAreRefusedNamingTheLineAndTheProblem) {
  const struct {
    std::string line, says;
  } cases[] = {
      {"{not json", "line 2: not valid JSON"},
      {"[1, 2]", "line 2: not a JSON object"},
      {R"({"prompt": "a", "completion": "b"})", "line 2: expected {\"messages\": [...]}"},
      {R"({"messages": []})", "line 2: expected {\"messages\": [...]}"},
      {R"({"messages": [{"role": "wizard", "content": "x"}]})",
       "line 2: messages[0].role must be one of"},
      {R"({"messages": [{"role": "user", "content": "x"}]})", "line 2: no assistant message"},
      {R"({"messages": [{"role": "user"}, {"role": "assistant", "content": "y"}]})",
       "line 2: messages[0].content is missing"},
      {R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]})",
       "line 2: messages[0].content must be a string"},
  };
  for (const auto& c : cases) {
    auto n = CheckChatJsonl(kRecord + "\n" + c.line + "\n");
    ASSERT_FALSE(n.ok()) << c.line;
    EXPECT_EQ(n.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(n.status().message().find(c.says), std::string::npos) << n.status().message();
  }
  EXPECT_NE(CheckChatJsonl("\n \n").status().message().find("no records"), std::string::npos);
}

class FileStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/file_store_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }
  std::string dir_;
};

TEST_F(FileStoreTest, StoresChecksAndListsUploads) {
  auto store = FileStore::Open(dir_ + "/files");
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto a = (*store)->Create("a.jsonl", "fine-tune", kRecord + "\n", "token:alice", std::nullopt);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->id.rfind("file-", 0), 0u);
  EXPECT_EQ(a->bytes, kRecord.size() + 1);
  EXPECT_EQ(a->records, 1);
  EXPECT_EQ(*ReadFile(a->path), kRecord + "\n");
  struct stat st {};
  ASSERT_EQ(stat(a->path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // uploads are the uploader's data

  auto got = (*store)->Get(a->id);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->filename, "a.jsonl");
  EXPECT_EQ(got->owner, "token:alice");
  EXPECT_EQ(got->path, a->path);

  auto bad =
      (*store)->Create("b.jsonl", "fine-tune", "{\"text\": 1}\n", "token:alice", std::nullopt);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  auto b = (*store)->Create("c.jsonl", "fine-tune", kRecord, "token:bob", std::nullopt);
  ASSERT_TRUE(b.ok());
  auto all = (*store)->List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);  // the refused upload left nothing behind

  for (const std::string id : {"file-nope", "../files", "file-0123456789abcdef01234567"}) {
    EXPECT_EQ((*store)->Get(id).status().code(), StatusCode::kNotFound) << id;
  }
}

}  // namespace
}  // namespace offloadd::daemon::openai
