#pragma once
// File-level helpers for a store directory: the LOCK file, the STORE identity file, the data
// file (with its O_DIRECT probe) and atomic replacement of small files. Errors name the path.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "storage/format.h"

namespace offloadd::storage {

// Creates `path` (and parents) when missing and `create` is set.
Status EnsureDirectory(const std::string& path, bool create);

// Opens `path`/LOCK and takes an exclusive flock, so two store processes never share a
// directory. The lock dies with the process (kill -9 included). Returns the fd to keep open.
StatusOr<int> LockDirectory(const std::string& path);

// Checks (or, for a new store, writes) the STORE identity files of all directories: one uuid,
// each directory at its configured position. Fails with FAILED_PRECONDITION on a mix-up.
Status SetupIdentities(const std::vector<std::string>& paths, bool create);

struct DataFile {
  int fd = -1;
  bool direct = false;
  uint64_t size = 0;
  std::string note;  // why O_DIRECT is off, for the log
};
// Opens (creating) `path`/data. `want_direct`: 0 off, 1 auto, 2 required.
StatusOr<DataFile> OpenDataFile(const std::string& path, int want_direct);

// Writes `bytes` to `dir`/`name` via a temporary file, fsync, rename and directory fsync.
Status ReplaceFileDurably(const std::string& dir, const std::string& name,
                          const std::vector<uint8_t>& bytes);
StatusOr<std::vector<uint8_t>> ReadWholeFile(int fd, const std::string& what);
// write(2) until done, retrying EINTR and short writes.
Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& what);
Status FsyncDirectory(const std::string& dir);

}  // namespace offloadd::storage
