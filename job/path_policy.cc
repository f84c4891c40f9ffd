#include "job/path_policy.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>
#include <set>

#include "common/safe_path.h"

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

namespace {

// Opens `path` as the job will and checks it is a regular file; "" when it is fine or absent.
std::string FileProblem(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return "";
  StatusOr<OwnedFd> fd = OpenConfined(path, O_RDONLY, Access::kRead);
  if (fd.ok()) return "";
  return std::string(fd.status().message());
}

}  // namespace

std::vector<std::string> ModelFileProblems(const std::string& dir) {
  std::set<std::string> names = {
      "config.json",           "generation_config.json",      "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json",     "chat_template.jinja",
      "tokenizer.model",
      "model.safetensors",     "model.safetensors.index.json"};
  const std::string index_path = dir + "/model.safetensors.index.json";
  std::vector<std::string> problems;
  if (const std::string p = FileProblem(index_path); !p.empty()) {
    problems.push_back(p);
    names.erase("model.safetensors.index.json");
  } else if (StatusOr<std::string> index = ReadFileConfined(index_path); index.ok()) {
    // The shards the index names (a malformed index is reported when the model loads).
    const nlohmann::json j = nlohmann::json::parse(*index, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("weight_map") && j["weight_map"].is_object()) {
      for (const auto& [tensor, file] : j["weight_map"].items()) {
        // Only a plain file name beside the index: the loader refuses any other.
        if (file.is_string() && names.size() < 4096) {
          const std::string f = file.get<std::string>();
          if (!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..")
            names.insert(f);
        }
      }
    }
  }
  names.erase("model.safetensors.index.json");
  for (const std::string& name : names) {
    if (std::string p = FileProblem(dir + "/" + name); !p.empty()) problems.push_back(std::move(p));
  }
  return problems;
}

StatusOr<std::optional<FileIdentity>> SubmitterFileIdentity(
    const std::string& submitted_by, const std::map<std::string, std::string>& token_users) {
  if (::geteuid() != 0) return std::optional<FileIdentity>();
  constexpr std::string_view kUnix = "unix:uid=", kToken = "token:";
  if (submitted_by.rfind(kUnix, 0) == 0) {
    const std::string digits = submitted_by.substr(kUnix.size());
    if (digits.empty() || digits.size() > 10 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgumentError("malformed client '" + submitted_by + "'");
    }
    return std::optional<FileIdentity>(IdentityOfUid(static_cast<uid_t>(std::stoull(digits))));
  }
  if (submitted_by.rfind(kToken, 0) == 0) {
    const auto it = token_users.find(submitted_by.substr(kToken.size()));
    if (it == token_users.end() || it->second.empty()) return std::optional<FileIdentity>();
    ASSIGN_OR_RETURN(FileIdentity id, IdentityOfUser(it->second));
    return std::optional<FileIdentity>(std::move(id));
  }
  return std::optional<FileIdentity>();
}

}  // namespace offloadd::daemon
