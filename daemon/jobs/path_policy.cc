#include "daemon/jobs/path_policy.h"

#include <limits.h>
#include <stdlib.h>

#include <cerrno>

namespace offloadd::daemon {
namespace {

StatusOr<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (realpath(path.c_str(), buf) == nullptr) return ErrnoError(errno, path);
  return std::string(buf);
}

bool IsUnder(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

}  // namespace

PathPolicy::PathPolicy(const std::vector<std::string>& allowed_roots) {
  for (const auto& r : allowed_roots) {
    auto real = RealPath(r);
    std::string root = real.ok() ? *real : r;
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    roots_.push_back(root);
  }
}

Status PathPolicy::CheckUnderRoot(const std::string& canonical, const std::string& original) const {
  for (const auto& root : roots_) {
    if (IsUnder(canonical, root)) return OkStatus();
  }
  std::string list;
  for (const auto& root : roots_) list += (list.empty() ? "" : ", ") + root;
  std::string msg = "'" + original + "'";
  if (canonical != original) msg += " (resolves to " + canonical + ")";
  return PermissionDeniedError(msg + " is outside the allowed roots [" + list +
                               "]; add a root to allowed_roots in the daemon config");
}

StatusOr<std::string> PathPolicy::ResolveExisting(const std::string& path) const {
  if (path.empty()) return InvalidArgumentError("path is empty");
  if (path[0] != '/') return InvalidArgumentError("'" + path + "' must be an absolute path");
  auto real = RealPath(path);
  if (!real.ok()) {
    if (real.status().code() == StatusCode::kNotFound) return NotFoundError("'" + path + "' does not exist");
    return real.status();
  }
  RETURN_IF_ERROR(CheckUnderRoot(*real, path));
  return *real;
}

StatusOr<std::string> PathPolicy::ResolveForWriting(const std::string& path) const {
  if (path.empty()) return InvalidArgumentError("path is empty");
  if (path[0] != '/') return InvalidArgumentError("'" + path + "' must be an absolute path");
  std::string existing = path;
  std::string rest;
  while (true) {
    auto real = RealPath(existing);
    if (real.ok()) {
      std::string full = *real;
      if (!rest.empty()) full += (full == "/" ? "" : "/") + rest;
      if (rest.find("..") != std::string::npos) {
        return InvalidArgumentError("'" + path + "' contains '..' below its existing part");
      }
      RETURN_IF_ERROR(CheckUnderRoot(full, path));
      return full;
    }
    if (real.status().code() != StatusCode::kNotFound) return real.status();
    const size_t slash = existing.find_last_of('/');
    if (slash == std::string::npos || existing == "/") return NotFoundError("no existing ancestor of '" + path + "'");
    const std::string last = existing.substr(slash + 1);
    if (!last.empty()) rest = rest.empty() ? last : last + "/" + rest;
    existing = slash == 0 ? "/" : existing.substr(0, slash);
  }
}

}  // namespace offloadd::daemon
