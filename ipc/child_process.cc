#include "ipc/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ipc/fd_passing.h"

namespace offloadd::ipc {

StatusOr<ChildProcess> LaunchChild(const std::string& binary, const std::vector<std::string>& args) {
  ASSIGN_OR_RETURN(SocketPair sockets, MakeSocketPair());
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<std::string> argv_s = {binary};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  argv_s.push_back("--control-fd=3");
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const int child_end = sockets.second.get();
  const pid_t pid = ::fork();
  if (pid < 0) return ErrnoError(errno, "fork for " + binary);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the parent died before prctl took effect
    if (child_end == 3) {
      ::fcntl(3, F_SETFD, 0);
    } else if (::dup2(child_end, 3) < 0) {  // dup2 clears close-on-exec
      ::_exit(126);
    }
    ::syscall(SYS_close_range, 4u, ~0u, 0u);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ChildProcess c;
  c.pid = pid;
  sockets.second.reset();
  c.control = std::move(sockets.first);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) c.pidfd.reset(pidfd);
  return c;
}

std::string DescribeExit(int status) {
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  }
  if (WIFEXITED(status)) {
    return "exited with code " + std::to_string(WEXITSTATUS(status)) +
           (WEXITSTATUS(status) == 127 ? " (could not be executed)" : "");
  }
  return "wait status " + std::to_string(status);
}

}  // namespace offloadd::ipc
