// Reading offloadctl's input files (job files, configurations to convert).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "client/offloadctl/commands/commands.h"
#include "common/units.h"

namespace offloadctl {

namespace {

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Reads `fd` to its end, failing once it holds more than `max_bytes`.
bool ReadBounded(int fd, size_t max_bytes, std::string* text, int* err) {
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      *err = errno;
      return false;
    }
    if (n == 0) return true;
    text->append(buf, static_cast<size_t>(n));
    if (text->size() > max_bytes) return true;  // the caller reports the size
  }
}

}  // namespace

// Only a regular file is opened (O_NONBLOCK, then fstat: a FIFO would block and /dev/zero never
// ends), and only up to `max_bytes`: a 100 MB JSON made the YAML parser abort with bad_alloc.
std::optional<std::string> ReadInputFile(const std::string& path, const std::string& what,
                                         const std::string& stdin_usage, size_t max_bytes,
                                         std::string* error) {
  const std::string limit = offloadd::FormatByteSize(max_bytes);
  std::string text;
  int err = 0;
  if (path == "-") {
    if (!ReadBounded(STDIN_FILENO, max_bytes, &text, &err)) {
      *error = "cannot read the " + what + " on stdin: " + std::strerror(err);
      return std::nullopt;
    }
    if (text.size() > max_bytes) {
      *error =
          "the " + what + " on stdin is larger than " + limit + ", the most a " + what + " may be";
      return std::nullopt;
    }
    if (text.empty()) *error = "the " + what + " on stdin (" + stdin_usage + ") is empty";
    return text.empty() ? std::nullopt : std::optional(text);
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    *error = errno == ENOENT
                 ? "the " + what + " '" + path + "' does not exist"
                 : "cannot read the " + what + " '" + path + "': " + std::strerror(errno);
    return std::nullopt;
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *error = "cannot stat the " + what + " '" + path + "': " + std::strerror(errno);
    return std::nullopt;
  }
  if (S_ISDIR(st.st_mode)) {
    *error = "'" + path + "' is a directory, not a " + what;
    return std::nullopt;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = "'" + path + "' is " + FileKind(st.st_mode) + ", not a " + what +
             " file; give a regular file (or - for stdin)";
    return std::nullopt;
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    *error = "the " + what + " '" + path + "' is " +
             offloadd::FormatByteSize(static_cast<uint64_t>(st.st_size)) + ", more than the " +
             limit + " a " + what + " may be";
    return std::nullopt;
  }
  if (!ReadBounded(fd, max_bytes, &text, &err)) {
    *error = "cannot read the " + what + " '" + path + "': " + std::strerror(err);
    return std::nullopt;
  }
  if (text.size() > max_bytes) {  // it grew while read
    *error = "the " + what + " '" + path + "' is larger than " + limit + ", the most a " + what +
             " may be";
    return std::nullopt;
  }
  return text;
}

}  // namespace offloadctl
