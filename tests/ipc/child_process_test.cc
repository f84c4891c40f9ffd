// The shared launcher of the helper processes (ipc/child_process.h): the child gets the control
// socket as fd 3 and no other inherited fd, the parent a pidfd, and exits are described.
#include "ipc/child_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace offloadd::ipc {
namespace {

std::string ReadRecord(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) return "<timeout>";
  char buf[4096];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

int Wait(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

TEST(ChildProcessTest, TheChildHasItsControlSocketAsFd3AndNoOtherInheritedFd) {
  // A file the parent opened without O_CLOEXEC: without the launcher's close_range the child
  // would hold it.
  char leak[] = "/tmp/offloadd-launch-leak.XXXXXX";
  const int leaked = ::mkstemp(leak);
  ASSERT_GE(leaked, 0);
  ASSERT_EQ(::fcntl(leaked, F_SETFD, 0), 0);
  // $0 is the appended --control-fd=3; the shell lists what its own fds point to, on fd 3.
  auto child = LaunchChild("/bin/sh", {"-c", "for f in /proc/$$/fd/*; do readlink \"$f\"; done | tr '\\n' ' ' >&3; "
                                             "echo \"$0\" >&3"});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_TRUE(child->pidfd.valid());
  const std::string fds = ReadRecord(child->control.get());
  const std::string arg = ReadRecord(child->control.get());
  EXPECT_EQ(fds.find(leak), std::string::npos) << fds;
  EXPECT_NE(fds.find("socket:"), std::string::npos) << fds;
  EXPECT_EQ(arg, "--control-fd=3\n");
  const int status = Wait(child->pid);
  EXPECT_EQ(DescribeExit(status), "exited with code 0");
  ::close(leaked);
  ::unlink(leak);
}

TEST(ChildProcessTest, AnExecFailureIsExitCode127AndSaysSo) {
  auto child = LaunchChild("/nonexistent/offloadd-worker", {});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(ReadRecord(child->control.get()), "") << "the control socket closes with the child";
  EXPECT_EQ(DescribeExit(Wait(child->pid)), "exited with code 127 (could not be executed)");
}

TEST(ChildProcessTest, ASignalledExitNamesTheSignal) {
  auto child = LaunchChild("/bin/sh", {"-c", "kill -9 $$"});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  EXPECT_EQ(DescribeExit(Wait(child->pid)), "killed by signal 9 (Killed)");
}

}  // namespace
}  // namespace offloadd::ipc
