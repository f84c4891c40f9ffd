#include "storage/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace offloadd::storage {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  constexpr Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};
constexpr Tables kTables;

#if defined(__x86_64__)
// One dependency chain of crc32 instructions (3-cycle latency) gives ~8 bytes per 3 cycles,
// several GB/s per core: above one SSD's bandwidth, and the store checksums chunks on its I/O
// threads in parallel, so interleaved streams are not worth their complexity here.
__attribute__((target("sse4.2"))) uint32_t HardwareImpl(uint32_t crc, const uint8_t* p,
                                                         size_t n) {
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  while (n >= 32) {
    uint64_t w0, w1, w2, w3;
    std::memcpy(&w0, p, 8);
    std::memcpy(&w1, p + 8, 8);
    std::memcpy(&w2, p + 16, 8);
    std::memcpy(&w3, p + 24, 8);
    c = _mm_crc32_u64(c, w0);
    c = _mm_crc32_u64(c, w1);
    c = _mm_crc32_u64(c, w2);
    c = _mm_crc32_u64(c, w3);
    p += 32;
    n -= 32;
  }
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return ~static_cast<uint32_t>(c);
}
#endif

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  const auto& t = kTables.t;
  while (size >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);  // little-endian host (x86_64, aarch64)
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool Crc32cHardwareAvailable() {
#if defined(__x86_64__)
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
#else
  return false;
#endif
}

uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t size) {
#if defined(__x86_64__)
  if (Crc32cHardwareAvailable()) {
    return HardwareImpl(crc, static_cast<const uint8_t*>(data), size);
  }
#endif
  return Crc32cPortable(crc, data, size);
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t size) {
  return Crc32cHardware(crc, data, size);
}

}  // namespace offloadd::storage
