#include "text/byte_source.h"

#include <unistd.h>

#include <cerrno>

namespace offloadd::text {

Status BufferByteSource::ReadAt(uint64_t offset, uint64_t n, std::string* out) const {
  out->assign(b_.substr(offset, n));
  return OkStatus();
}

Status FileByteSource::ReadAt(uint64_t offset, uint64_t n, std::string* out) const {
  out->resize(n);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t got =
        ::pread(fd_.get(), out->data() + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return ErrnoError(errno, path_ + ": read");
    if (got == 0)
      return DataLossError(path_ + ": the file ended early (was it truncated while read?)");
    done += static_cast<uint64_t>(got);
  }
  return OkStatus();
}

}  // namespace offloadd::text
