#pragma once
// Whole-file reads, atomic writes and small path helpers: the one copy of each for the tree
// (reads and writes of a job's files are confined by common/safe_path.h, which these call).
// Deliberately not std::filesystem: the CUDA LibTorch (libtorch.so) exports its own
// std::filesystem symbols, which interpose on libstdc++'s in any binary linking it, and some of
// them (remove_all) crash there. Thread-safe.

#include <string>
#include <string_view>

#include "common/status.h"

namespace offloadd {

std::string JoinPath(const std::string& dir, const std::string& name);
bool PathExists(const std::string& path);
// mkdir -p
Status MakeDirs(const std::string& path);
// True if both exist and are the same inode.
bool SameFile(const std::string& a, const std::string& b);
// Reads a whole regular file, inside the allowed roots when they are set (ReadFileConfined).
// Errors name the path; FAILED_PRECONDITION for a FIFO, device or directory.
StatusOr<std::string> ReadFile(const std::string& path);
// Writes `path` atomically and durably: a temporary file in the same directory, fsync'd, renamed
// over `path`, then the directory fsync'd (WriteFileAtomically in common/safe_path.h, which also
// takes a callback that writes to the descriptor).
Status WriteFile(const std::string& path, std::string_view contents);
// ReadFile(from), then WriteFile(to).
Status CopyFile(const std::string& from, const std::string& to);
// rm -rf (for tests and temporary directories); OK if absent.
Status RemoveTree(const std::string& path);

}  // namespace offloadd
