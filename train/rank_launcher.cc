#include "train/rank_launcher.h"

#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "ipc/child_process.h"

namespace offloadd::trainer {
namespace {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace

int RunRanks(const std::string& self, const std::vector<std::string>& args, int ranks, bool cuda) {
  char dir_template[] = "/tmp/offloadd-train-rendezvous-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::fprintf(stderr, "offloadd-train: cannot create a rendezvous directory: %s\n", std::strerror(errno));
    return 1;
  }
  const std::string dir = dir_template;
  std::vector<std::string> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); cuda && v != nullptr && *v != '\0') visible = Split(v, ',');
  if (cuda && !visible.empty() && static_cast<int>(visible.size()) < ranks) {
    std::fprintf(stderr, "offloadd-train: --gpus=%d but CUDA_VISIBLE_DEVICES lists %zu\n", ranks, visible.size());
    return 2;
  }
  std::vector<ipc::ChildProcess> children;
  int code = 0;
  for (int r = 0; r < ranks && code == 0; ++r) {
    std::vector<std::string> a = args;
    a.push_back("--rank=" + std::to_string(r));
    a.push_back("--world-size=" + std::to_string(ranks));
    a.push_back("--rendezvous=file://" + dir + "/store");
    if (cuda) setenv("CUDA_VISIBLE_DEVICES", visible.empty() ? std::to_string(r).c_str() : visible[r].c_str(), 1);
    auto child = ipc::LaunchChild(self, a);
    if (!child.ok()) {
      std::fprintf(stderr, "offloadd-train: starting rank %d: %s\n", r, child.status().ToString().c_str());
      code = 1;
      break;
    }
    children.push_back(std::move(*child));
  }
  // Wait for every rank; the first failure ends the others.
  std::vector<bool> done(children.size(), false);
  size_t left = children.size();
  while (left > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (size_t r = 0; r < children.size(); ++r) {
      if (children[r].pid != pid || done[r]) continue;
      done[r] = true;
      --left;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!ok && code == 0) {
        std::fprintf(stderr, "offloadd-train: rank %zu %s; stopping the other ranks\n", r,
                     ipc::DescribeExit(status).c_str());
        code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
        for (size_t o = 0; o < children.size(); ++o) {
          if (!done[o]) kill(children[o].pid, SIGKILL);
        }
      }
    }
  }
  unlink((dir + "/store").c_str());
  rmdir(dir.c_str());
  return code;
}

}  // namespace offloadd::trainer
