#include "daemon/server/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include <gtest/gtest.h>

#include "common/file.h"

namespace offloadd::daemon {
namespace {

// POSIX helpers, not std::filesystem: this binary links the daemon core and so LibTorch, whose CUDA
// build interposes its own std::filesystem (docs/DEVELOPING.md).
bool IsDirectory(const std::string& path) {
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd_sock_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  int Listen(const std::string& path) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    return fd;
  }

  std::string dir_;
};

TEST_F(UnixSocketTest, CreatesParentDirectory) {
  EXPECT_TRUE(PrepareUnixSocketPath(dir_ + "/a/b/offloadd.sock").ok());
  EXPECT_TRUE(IsDirectory(dir_ + "/a/b"));
}

TEST_F(UnixSocketTest, RemovesStaleSocket) {
  const std::string path = dir_ + "/s.sock";
  const int fd = Listen(path);  // bound but not listening: connect is refused, like a dead daemon
  close(fd);
  ASSERT_TRUE(PathExists(path));
  EXPECT_TRUE(PrepareUnixSocketPath(path).ok());
  EXPECT_FALSE(PathExists(path));
}

TEST_F(UnixSocketTest, RefusesLiveSocket) {
  const std::string path = dir_ + "/s.sock";
  const int fd = Listen(path);
  ASSERT_EQ(listen(fd, 1), 0);
  const Status s = PrepareUnixSocketPath(path);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("already serving"), std::string::npos) << s.message();
  EXPECT_TRUE(PathExists(path));
  close(fd);
}

TEST_F(UnixSocketTest, RefusesRegularFile) {
  const std::string path = dir_ + "/not_a_socket";
  std::ofstream(path) << "precious";
  const Status s = PrepareUnixSocketPath(path);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(PathExists(path));
}

TEST_F(UnixSocketTest, SetsMode) {
  const std::string path = dir_ + "/s.sock";
  const int fd = Listen(path);
  ASSERT_TRUE(SetSocketMode(path, 0600).ok());
  struct stat st{};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  close(fd);
}

}  // namespace
}  // namespace offloadd::daemon
