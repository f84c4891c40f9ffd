#pragma once
// gzip-compressed files (datasets as *.jsonl.gz / *.json.gz), inflated with zlib as they are
// read: the compressed file is read in 256 KiB pieces and the caller takes the text in pieces of
// its own size, so memory stays bounded whatever the file's size. Concatenated gzip members
// (`cat a.gz b.gz`, pigz, bgzip) are read as one stream, as gzip -d does.
//
// Errors name the file: DATA_LOSS for a truncated stream (it ends inside a member) or corrupt
// data (zlib's message, with the compressed offset), else the errno of the read.

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/safe_path.h"
#include "common/status.h"

namespace offloadd::text {

// Whether `head` starts with gzip's magic bytes 1f 8b.
bool HasGzipMagic(std::string_view head);
// Whether the regular file open at `fd` starts with gzip's magic (pread: the offset is kept).
StatusOr<bool> IsGzipFile(int fd, const std::string& path);

class GzipReader {
 public:
  // Takes the open file; `path` names it in errors.
  static StatusOr<std::unique_ptr<GzipReader>> Open(OwnedFd fd, std::string path);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Inflates up to `size` bytes into `out`; returns how many. 0 only at the end of the stream.
  StatusOr<size_t> Read(char* out, size_t size);
  uint64_t compressed_offset() const { return consumed_ - zs_.avail_in; }
  uint64_t decompressed_bytes() const { return produced_; }
  const std::string& path() const { return path_; }

 private:
  GzipReader(OwnedFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  Status Fill();

  OwnedFd fd_;
  std::string path_;
  z_stream zs_{};
  bool initialised_ = false;
  std::vector<unsigned char> in_;
  bool input_eof_ = false;
  bool in_member_ = false;  // some of the current member has been given to inflate
  bool done_ = false;
  uint64_t consumed_ = 0;  // compressed bytes read from the file
  uint64_t produced_ = 0;
};

}  // namespace offloadd::text
