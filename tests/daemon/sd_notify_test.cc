#include "daemon/systemd/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace offloadd::daemon {
namespace {

TEST(SdNotifyTest, NoSocketIsANoOp) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_TRUE(SdNotify("READY=1").ok());
}

TEST(SdNotifyTest, SendsDatagramToNotifySocket) {
  const std::string path = "/tmp/offloadd_notify_" + std::to_string(getpid());
  unlink(path.c_str());
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  setenv("NOTIFY_SOCKET", path.c_str(), 1);
  ASSERT_TRUE(SdNotify("READY=1\nSTATUS=serving").ok());
  char buf[128] = {};
  const ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "READY=1\nSTATUS=serving");
  close(fd);
  unlink(path.c_str());
  unsetenv("NOTIFY_SOCKET");
}

TEST(SdNotifyTest, MissingPeerIsAnError) {
  setenv("NOTIFY_SOCKET", "/tmp/offloadd_no_such_notify_socket", 1);
  EXPECT_FALSE(SdNotify("READY=1").ok());
  unsetenv("NOTIFY_SOCKET");
}

}  // namespace
}  // namespace offloadd::daemon
