#include "common/safe_path.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

namespace offloadd {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Put(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

bool IsSymlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

std::string FdPath(int fd) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// base/root is the allowed root, base/outside lies outside it.
class SafePathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/safe_path_test.XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    char real[PATH_MAX];
    ASSERT_NE(::realpath(templ, real), nullptr);
    base_ = real;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(outside_.c_str(), 0755), 0);
    Put(outside_ + "/secret", "secret");
  }
  void TearDown() override {
    SetAllowedRoots({});
    SetFsyncObserverForTesting(nullptr);
    ASSERT_EQ(std::system(("rm -rf '" + base_ + "'").c_str()), 0);
  }
  void Confine() { SetAllowedRoots({root_}); }

  std::string base_, root_, outside_;
};

TEST_F(SafePathTest, ReadRefusesASymlinkLeadingOutOfTheRoot) {
  Confine();
  ASSERT_EQ(::symlink((outside_ + "/secret").c_str(), (root_ + "/config.json").c_str()), 0);
  ASSERT_EQ(::symlink("../outside/secret", (root_ + "/relative.json").c_str()), 0);
  for (const char* name : {"/config.json", "/relative.json"}) {
    auto r = ReadFileConfined(root_ + name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
    EXPECT_NE(r.status().message().find(root_ + name), std::string::npos) << r.status().ToString();
  }
}

TEST_F(SafePathTest, ReadFollowsARelativeSymlinkThatStaysUnderTheRoot) {
  Confine();  // a Hugging Face cache snapshot links into ../../blobs
  ASSERT_EQ(::mkdir((root_ + "/blobs").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root_ + "/snap").c_str(), 0755), 0);
  Put(root_ + "/blobs/abc", "{}");
  ASSERT_EQ(::symlink("../blobs/abc", (root_ + "/snap/config.json").c_str()), 0);
  auto r = ReadFileConfined(root_ + "/snap/config.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "{}");
}

TEST_F(SafePathTest, PathsOutsideTheRootsOrWithDotDotAreRefused) {
  Confine();
  auto r = ReadFileConfined(outside_ + "/secret");
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  r = ReadFileConfined(root_ + "/../outside/secret");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  r = ReadFileConfined("relative/path");
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
}

TEST_F(SafePathTest, ReadRefusesAFifoWithoutBlocking) {
  Confine();
  ASSERT_EQ(::mkfifo((root_ + "/fifo").c_str(), 0644), 0);
  auto r = ReadFileConfined(root_ + "/fifo");
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
}

// Every open, not only ReadFileConfined, refuses a FIFO or a device without
// blocking (a FIFO in a model directory hung a job at its first checkpoint), for reading and for
// writing, confined or not; a regular file comes back in the blocking mode asked for.
TEST_F(SafePathTest, EveryOpenRefusesAFifoOrDeviceWithoutBlocking) {
  ASSERT_EQ(::mkfifo((root_ + "/fifo").c_str(), 0644), 0);
  for (bool confined : {false, true}) {
    SetAllowedRoots(confined ? std::vector<std::string>{root_} : std::vector<std::string>{});
    for (int flags : {O_RDONLY, O_WRONLY, O_RDWR, O_WRONLY | O_TRUNC}) {
      auto fd =
          OpenConfined(root_ + "/fifo", flags, flags == O_RDONLY ? Access::kRead : Access::kWrite);
      ASSERT_FALSE(fd.ok()) << flags;
      EXPECT_EQ(fd.status().code(), StatusCode::kFailedPrecondition) << fd.status().ToString();
      EXPECT_NE(fd.status().message().find(root_ + "/fifo"), std::string::npos)
          << fd.status().ToString();
      EXPECT_NE(fd.status().message().find("not a regular file"), std::string::npos)
          << fd.status().ToString();
    }
    auto dev = OpenConfined("/dev/null", O_RDONLY, Access::kRead);
    if (!confined) {
      EXPECT_EQ(dev.status().code(), StatusCode::kFailedPrecondition) << dev.status().ToString();
    }
  }
  Put(root_ + "/file", "x");
  Confine();
  auto fd = OpenConfined(root_ + "/file", O_RDONLY, Access::kRead);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(::fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
  auto nb = OpenConfined(root_ + "/file", O_RDONLY | O_NONBLOCK, Access::kRead);
  ASSERT_TRUE(nb.ok()) << nb.status().ToString();
  EXPECT_NE(::fcntl(nb->get(), F_GETFL) & O_NONBLOCK, 0);
  // Directories are opened as asked (O_DIRECTORY).
  EXPECT_TRUE(OpenConfined(root_, O_RDONLY | O_DIRECTORY, Access::kRead).ok());
}

TEST_F(SafePathTest, WriteReplacesASymlinkInsteadOfWritingThroughIt) {
  for (bool confined : {false, true}) {
    SetAllowedRoots(confined ? std::vector<std::string>{root_} : std::vector<std::string>{});
    const std::string target = root_ + "/config.json";
    ::unlink(target.c_str());
    ASSERT_EQ(::symlink((outside_ + "/secret").c_str(), target.c_str()), 0);
    Status st = WriteFileAtomically(target, "new");
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(Slurp(outside_ + "/secret"), "secret");
    EXPECT_FALSE(IsSymlink(target));
    EXPECT_EQ(Slurp(target), "new");
  }
}

TEST_F(SafePathTest, WriteRefusesADirectoryReplacedBySymlink) {
  Confine();
  ASSERT_EQ(::symlink(outside_.c_str(), (root_ + "/out").c_str()), 0);
  Status st = WriteFileAtomically(root_ + "/out/model.safetensors", "x");
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find(root_ + "/out"), std::string::npos) << st.ToString();
  auto dir = MakeDirsConfined(root_ + "/out/sub");
  EXPECT_EQ(dir.status().code(), StatusCode::kPermissionDenied) << dir.status().ToString();
  EXPECT_NE(dir.status().message().find("symbolic link"), std::string::npos);
  EXPECT_FALSE(IsSymlink(outside_ + "/sub") || ::access((outside_ + "/sub").c_str(), F_OK) == 0);
  EXPECT_EQ(Slurp(outside_ + "/secret"), "secret");
}

TEST_F(SafePathTest, MakeDirsCreatesNestedDirectoriesUnderTheRoot) {
  Confine();
  auto dir = MakeDirsConfined(root_ + "/a/b/c");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  EXPECT_EQ(FdPath(dir->get()), root_ + "/a/b/c");
  auto again = MakeDirsConfined(root_ + "/a/b/c");
  EXPECT_TRUE(again.ok()) << again.status().ToString();
  Put(root_ + "/file", "");
  EXPECT_EQ(MakeDirsConfined(root_ + "/file/x").status().code(), StatusCode::kFailedPrecondition);
}

TEST_F(SafePathTest, AtomicWriteFsyncsTheFileAndItsDirectory) {
  Confine();
  std::set<std::string> synced;
  SetFsyncObserverForTesting([&](int fd) { synced.insert(FdPath(fd)); });
  ASSERT_TRUE(WriteFileAtomically(root_ + "/f.json", "{}").ok());
  // The file was fsync'd under its temporary name, then renamed; the directory after the rename.
  EXPECT_TRUE(synced.count(root_)) << ::testing::PrintToString(synced);
  bool file_synced = false;
  for (const auto& p : synced) file_synced |= p.rfind(root_ + "/.f.json.tmp-", 0) == 0;
  EXPECT_TRUE(file_synced) << ::testing::PrintToString(synced);
  EXPECT_EQ(Slurp(root_ + "/f.json"), "{}");
}

TEST_F(SafePathTest, FailedFillLeavesTheOldFileAndNoTemporary) {
  Put(root_ + "/f", "old");
  Status st = WriteFileAtomically(root_ + "/f", [](int) { return InternalError("boom"); });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(Slurp(root_ + "/f"), "old");
  EXPECT_EQ(std::system(("test -z \"$(ls -A '" + root_ + "' | grep tmp)\"").c_str()), 0);
}

}  // namespace
}  // namespace offloadd
