// The file helpers checkpoint.cc and checkpoint_compact.cc share (checkpoint_state.h): layer file
// names, synced writes with their crc32c, safetensors headers.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "common/crc32c.h"
#include "common/file.h"
#include "common/file_identity.h"
#include "common/safe_path.h"
#include "trainer/state/checkpoint_state.h"

namespace offloadd::trainer::checkpoint_internal {

std::string LayerFile(const char* kind, int layer) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s-layer-%05d.safetensors", kind, layer);
  return buf;
}

// Creates `name` in the directory `dirfd` (`path` names it in messages), which must not exist and
// is never reached through a symlink; writes the chunks, fsyncs, and returns their crc32c. Removes
// the file on failure.
StatusOr<uint32_t> WriteSyncedFile(int dirfd, const std::string& name, const std::string& path,
                                   const std::vector<std::span<const std::byte>>& chunks) {
  AsJobUser as_user;  // with the rights of the job's user (common/file_identity.h)
  RETURN_IF_ERROR(as_user.status());
  const int fd =
      ::openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "create " + path);
  Status st;
  uint32_t crc = 0;
  for (const auto& c : chunks) {
    crc = Crc32c(crc, c.data(), c.size());
    st = WriteAll(fd, c.data(), c.size(), path);
    if (!st.ok()) break;
  }
  if (st.ok()) st = FsyncFd(fd, path);
  if (::close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + path);
  if (!st.ok()) {
    ::unlinkat(dirfd, name.c_str(), 0);
    return st;
  }
  return crc;
}

std::string SafetensorsPrefix(const std::vector<HeaderEntry>& entries,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const HeaderEntry& e : entries) {
    uint64_t numel = 1;
    for (int64_t d : *e.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t bytes = numel * e.element_bytes;
    header[e.name] = {
        {"dtype", e.dtype}, {"shape", *e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text;
}

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

}  // namespace offloadd::trainer::checkpoint_internal
