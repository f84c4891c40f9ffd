#pragma once
// Small POSIX file helpers for the engine. Deliberately not std::filesystem: the CUDA LibTorch
// (libtorch.so) exports its own std::filesystem symbols, which interpose on libstdc++'s in any
// binary linking it, and some of them (remove_all) crash there.

#include <string>

#include "common/status.h"

namespace offloadd::engine {

std::string JoinPath(const std::string& dir, const std::string& name);
bool PathExists(const std::string& path);
// mkdir -p
Status MakeDirs(const std::string& path);
// True if both exist and are the same inode.
bool SameFile(const std::string& a, const std::string& b);
// Regular files only, inside the allowed roots when set (common/safe_path.h); CopyFile writes `to`
// atomically and durably.
Status CopyFile(const std::string& from, const std::string& to);
StatusOr<std::string> ReadFile(const std::string& path);
// rm -rf (for tests and temporary directories); OK if absent.
Status RemoveTree(const std::string& path);

}  // namespace offloadd::engine
