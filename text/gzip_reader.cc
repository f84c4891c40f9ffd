#include "text/gzip_reader.h"

#include <unistd.h>

#include <cerrno>

namespace offloadd::text {

namespace {
constexpr size_t kInputPiece = 256 << 10;
}  // namespace

bool HasGzipMagic(std::string_view head) {
  return head.size() >= 2 && static_cast<unsigned char>(head[0]) == 0x1f &&
         static_cast<unsigned char>(head[1]) == 0x8b;
}

StatusOr<bool> IsGzipFile(int fd, const std::string& path) {
  char head[2];
  ssize_t n;
  do {
    n = ::pread(fd, head, sizeof head, 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError(errno, "cannot read " + path);
  return HasGzipMagic(std::string_view(head, static_cast<size_t>(n)));
}

StatusOr<std::unique_ptr<GzipReader>> GzipReader::Open(OwnedFd fd, std::string path) {
  std::unique_ptr<GzipReader> r(new GzipReader(std::move(fd), std::move(path)));
  // 16 + MAX_WBITS: a gzip header and trailer (CRC-32 and length checked by zlib), not zlib's.
  if (inflateInit2(&r->zs_, 16 + MAX_WBITS) != Z_OK) {
    return ResourceExhaustedError(r->path_ + ": cannot start zlib's inflate");
  }
  r->initialised_ = true;
  r->in_.resize(kInputPiece);
  return r;
}

GzipReader::~GzipReader() {
  if (initialised_) inflateEnd(&zs_);
}

Status GzipReader::Fill() {
  ssize_t n;
  do {
    n = ::read(fd_.get(), in_.data(), in_.size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError(errno, "cannot read " + path_);
  if (n == 0) {
    input_eof_ = true;
    return OkStatus();
  }
  zs_.next_in = in_.data();
  zs_.avail_in = static_cast<uInt>(n);
  consumed_ += static_cast<uint64_t>(n);
  return OkStatus();
}

StatusOr<size_t> GzipReader::Read(char* out, size_t size) {
  if (done_ || size == 0) return size_t{0};
  const auto want = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
  zs_.next_out = reinterpret_cast<Bytef*>(out);
  zs_.avail_out = want;
  while (zs_.avail_out == want) {
    if (zs_.avail_in == 0 && !input_eof_) RETURN_IF_ERROR(Fill());
    if (zs_.avail_in == 0 && input_eof_) {
      if (!in_member_) {
        done_ = true;
        break;
      }
      return DataLossError(path_ + ": truncated gzip stream (it ends inside a member, after " +
                           std::to_string(consumed_) + " compressed bytes, " +
                           std::to_string(produced_ + (want - zs_.avail_out)) + " bytes inflated)");
    }
    in_member_ = true;
    const int rc = inflate(&zs_, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      // The next member, if any, starts right after; anything else there is refused as corrupt.
      in_member_ = false;
      if (inflateReset(&zs_) != Z_OK) return InternalError(path_ + ": zlib inflateReset failed");
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      return DataLossError(path_ + ": corrupt gzip data near compressed byte " +
                           std::to_string(compressed_offset()) + ": " +
                           (zs_.msg != nullptr ? zs_.msg : "zlib error " + std::to_string(rc)));
    }
  }
  const size_t got = want - zs_.avail_out;
  produced_ += got;
  return got;
}

}  // namespace offloadd::text
