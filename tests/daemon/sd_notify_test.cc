#include "daemon/systemd/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
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

// The abstract namespace ("@name"), which systemd itself uses for NOTIFY_SOCKET.
TEST(SdNotifyTest, SendsDatagramToAbstractSocket) {
  const std::string name = "offloadd_notify_abstract_" + std::to_string(getpid());
  const int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
  setenv("NOTIFY_SOCKET", ("@" + name).c_str(), 1);
  ASSERT_TRUE(SdNotify("WATCHDOG=1").ok());
  char buf[64] = {};
  const ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "WATCHDOG=1");
  close(fd);
  unsetenv("NOTIFY_SOCKET");
}

TEST(SdWatchdogTest, IntervalFromWatchdogUsecForThisPid) {
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  auto none = SdWatchdogInterval();
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());

  setenv("WATCHDOG_USEC", "30000000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  auto mine = SdWatchdogInterval();
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  ASSERT_TRUE(mine->has_value());
  EXPECT_EQ(mine->value(), std::chrono::seconds(30));

  // Meant for another process (the executors inherit the environment): not ours to answer.
  setenv("WATCHDOG_PID", std::to_string(getpid() + 1).c_str(), 1);
  auto other = SdWatchdogInterval();
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE(other->has_value());

  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  setenv("WATCHDOG_USEC", "soon", 1);
  EXPECT_FALSE(SdWatchdogInterval().ok());
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
}

}  // namespace
}  // namespace offloadd::daemon
