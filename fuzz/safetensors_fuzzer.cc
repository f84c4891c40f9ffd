// Fuzzes the safetensors reader: the input is a whole .safetensors file (u64 header length, JSON
// header, data buffer), opened through SafetensorsFile::Open exactly as a model directory's file
// is (mmap of a memfd, so no disk IO per input). On success the header's promises are checked:
// every tensor's bytes lie inside the file, match dtype x shape, and tile the buffer.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/safetensors.h"
#include "fuzz/fuzz_util.h"

using offloadd::engine::DTypeSize;
using offloadd::engine::SafetensorsFile;

namespace {

int MemFd() {
  static const int fd = [] {
    int f = memfd_create("safetensors_fuzz", MFD_CLOEXEC);
    if (f < 0) offloadd::fuzz::SetupFailed("memfd_create failed");
    return f;
  }();
  return fd;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = MemFd();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) {
    offloadd::fuzz::SetupFailed("writing the memfd failed");
  }
  auto file = SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (!file.ok()) return 0;

  uint64_t header_len = 0;
  FUZZ_CHECK(size >= 8);
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  FUZZ_CHECK(header_len <= size - 8);
  const uint64_t data_size = size - 8 - header_len;
  uint64_t covered = 0;
  for (const auto& t : (*file)->tensors()) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= data_size);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      FUZZ_CHECK(d >= 0);
      numel *= static_cast<uint64_t>(d);
    }
    FUZZ_CHECK(numel * DTypeSize(t.dtype) == t.nbytes());
    FUZZ_CHECK((*file)->Find(t.name) == &t);
    auto bytes = (*file)->data(t);
    FUZZ_CHECK(bytes.size() == t.nbytes());
    // The span must point into the input: compare with the bytes we wrote.
    if (!bytes.empty()) {
      FUZZ_CHECK(static_cast<uint8_t>(bytes.front()) == data[8 + header_len + t.begin]);
      FUZZ_CHECK(static_cast<uint8_t>(bytes.back()) == data[8 + header_len + t.end - 1]);
    }
    covered += t.nbytes();
  }
  FUZZ_CHECK(covered == data_size);
  return 0;
}
