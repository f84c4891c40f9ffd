// common/file.h: the one whole-file read and the one atomic, durable write of the tree, and the
// path helpers that came with them from the engine.
#include "common/file.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/safe_path.h"

namespace offloadd {
namespace {

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd-file-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    SetFsyncObserverForTesting(nullptr);
    ASSERT_TRUE(RemoveTree(dir_).ok());
  }
  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }
  std::set<std::string> Names() const {
    std::set<std::string> out;
    DIR* d = ::opendir(dir_.c_str());
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.insert(n);
    }
    ::closedir(d);
    return out;
  }
  std::string dir_;
};

TEST_F(FileTest, WriteThenReadReturnsTheBytesIncludingNuls) {
  const std::string data("a\0b\nc", 5);
  ASSERT_TRUE(WriteFile(Path("f.bin"), data).ok());
  const StatusOr<std::string> back = ReadFile(Path("f.bin"));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, data);
  EXPECT_EQ(Names(), std::set<std::string>{"f.bin"}) << "no temporary file is left behind";
}

TEST_F(FileTest, WriteReplacesAndFsyncsTheFileAndItsDirectory) {
  ASSERT_TRUE(WriteFile(Path("f"), "old").ok());
  int fsyncs = 0;
  SetFsyncObserverForTesting([&](int) { ++fsyncs; });
  ASSERT_TRUE(WriteFile(Path("f"), "new").ok());
  SetFsyncObserverForTesting(nullptr);
  EXPECT_EQ(fsyncs, 2) << "the temporary file before the rename, the directory after it";
  EXPECT_EQ(*ReadFile(Path("f")), "new");
}

TEST_F(FileTest, AFailedWriteLeavesNothingAndNamesThePath) {
  const Status s = WriteFile(Path("missing/f"), "x");
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
  EXPECT_NE(s.message().find(Path("missing")), std::string::npos) << s.message();
  EXPECT_TRUE(Names().empty());
}

TEST_F(FileTest, ReadRefusesWhatIsNotARegularFileAndNamesThePath) {
  const StatusOr<std::string> missing = ReadFile(Path("nope"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(Path("nope")), std::string::npos);
  EXPECT_EQ(ReadFile(dir_).status().code(), StatusCode::kFailedPrecondition);
  // A FIFO without a writer: refused at once, never waited on.
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0600), 0);
  const StatusOr<std::string> fifo = ReadFile(Path("fifo"));
  EXPECT_EQ(fifo.status().code(), StatusCode::kFailedPrecondition) << fifo.status().ToString();
  EXPECT_NE(fifo.status().message().find(Path("fifo")), std::string::npos);
}

TEST_F(FileTest, CopyFileCopiesTheBytes) {
  ASSERT_TRUE(WriteFile(Path("a"), "contents").ok());
  ASSERT_TRUE(CopyFile(Path("a"), Path("b")).ok());
  EXPECT_EQ(*ReadFile(Path("b")), "contents");
  EXPECT_TRUE(SameFile(Path("a"), Path("a")));
  EXPECT_FALSE(SameFile(Path("a"), Path("b")));
  EXPECT_EQ(CopyFile(Path("none"), Path("c")).code(), StatusCode::kNotFound);
  EXPECT_FALSE(PathExists(Path("c")));
}

TEST_F(FileTest, PathHelpers) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  ASSERT_TRUE(MakeDirs(Path("x/y/z")).ok());
  EXPECT_TRUE(PathExists(Path("x/y/z")));
  ASSERT_TRUE(WriteFile(Path("x/y/z/f"), "1").ok());
  ASSERT_TRUE(WriteFile(Path("plain"), "1").ok());
  EXPECT_EQ(MakeDirs(Path("plain/sub")).code(), StatusCode::kInvalidArgument)
      << "a component that is a file";
  ASSERT_TRUE(RemoveTree(Path("x")).ok());
  EXPECT_FALSE(PathExists(Path("x")));
  EXPECT_TRUE(RemoveTree(Path("x")).ok()) << "absent is fine";
}

}  // namespace
}  // namespace offloadd
