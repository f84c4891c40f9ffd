// Random access to a file's bytes for the columnar readers (parquet_reader.cc,
// arrow_ipc_reader.cc): pread on an open file, or a buffer (the fuzz harnesses, tests).
#ifndef OFFLOADD_TEXT_BYTE_SOURCE_H_
#define OFFLOADD_TEXT_BYTE_SOURCE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "common/safe_path.h"
#include "common/status.h"

namespace offloadd::text {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Bytes [offset, offset + n); the caller keeps the range inside size().
  virtual Status ReadAt(uint64_t offset, uint64_t n, std::string* out) const = 0;
};

class BufferByteSource final : public ByteSource {
 public:
  explicit BufferByteSource(std::string_view b) : b_(b) {}
  uint64_t size() const override { return b_.size(); }
  Status ReadAt(uint64_t offset, uint64_t n, std::string* out) const override;

 private:
  std::string_view b_;
};

// Reads with pread (EINTR retried); a file shorter than it was at open is DATA_LOSS naming it.
class FileByteSource final : public ByteSource {
 public:
  FileByteSource(OwnedFd fd, uint64_t size, std::string path)
      : fd_(std::move(fd)), size_(size), path_(std::move(path)) {}
  uint64_t size() const override { return size_; }
  Status ReadAt(uint64_t offset, uint64_t n, std::string* out) const override;

 private:
  OwnedFd fd_;
  uint64_t size_;
  std::string path_;
};

}  // namespace offloadd::text

#endif  // OFFLOADD_TEXT_BYTE_SOURCE_H_
