#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace offloadd {
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
// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so three
// independent streams over adjacent blocks run ~3x faster than one; the three partial CRCs are
// then combined by "appending zeros" to the earlier ones with precomputed GF(2) operators
// (Mark Adler's method, as in zlib's crc32_combine). Blocks of kLong bytes, then kShort.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

uint32_t Gf2MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void Gf2MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = Gf2MatrixTimes(mat, mat[n]);
}

// Tables applying the operator "append `len` zero bytes" (len a power of two) byte by byte.
using ShiftTable = std::array<std::array<uint32_t, 256>, 4>;
ShiftTable MakeShiftTable(size_t len) {
  uint32_t odd[32], even[32];
  odd[0] = kPoly;  // one zero bit
  for (uint32_t n = 1, row = 1; n < 32; ++n, row <<= 1) odd[n] = row;
  Gf2MatrixSquare(even, odd);  // two zero bits
  Gf2MatrixSquare(odd, even);  // four zero bits
  const uint32_t* op = nullptr;
  for (;;) {  // squaring turns the operator for 2^k bits into 2^(k+1); 8 bits = one byte
    Gf2MatrixSquare(even, odd);
    len >>= 1;
    if (len == 0) {
      op = even;
      break;
    }
    Gf2MatrixSquare(odd, even);
    len >>= 1;
    if (len == 0) {
      op = odd;
      break;
    }
  }
  ShiftTable t{};
  for (uint32_t n = 0; n < 256; ++n) {
    t[0][n] = Gf2MatrixTimes(op, n);
    t[1][n] = Gf2MatrixTimes(op, n << 8);
    t[2][n] = Gf2MatrixTimes(op, n << 16);
    t[3][n] = Gf2MatrixTimes(op, n << 24);
  }
  return t;
}

inline uint32_t Shift(const ShiftTable& t, uint32_t crc) {
  return t[0][crc & 0xFF] ^ t[1][(crc >> 8) & 0xFF] ^ t[2][(crc >> 16) & 0xFF] ^ t[3][crc >> 24];
}

__attribute__((target("sse4.2"))) inline uint64_t Crc8(uint64_t c, const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return _mm_crc32_u64(c, w);
}

__attribute__((target("sse4.2"))) uint64_t ThreeWay(uint64_t c0, const uint8_t*& p, size_t& n,
                                                    size_t block, const ShiftTable& shift) {
  while (n >= 3 * block) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t* end = p + block;
    do {
      c0 = Crc8(c0, p);
      c1 = Crc8(c1, p + block);
      c2 = Crc8(c2, p + 2 * block);
      p += 8;
    } while (p < end);
    c0 = Shift(shift, static_cast<uint32_t>(c0)) ^ c1;
    c0 = Shift(shift, static_cast<uint32_t>(c0)) ^ c2;
    p += 2 * block;
    n -= 3 * block;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t HardwareImpl(uint32_t crc, const uint8_t* p, size_t n) {
  static const ShiftTable kLongShift = MakeShiftTable(kLong);
  static const ShiftTable kShortShift = MakeShiftTable(kShort);
  uint64_t c = ~crc;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  c = ThreeWay(c, p, n, kLong, kLongShift);
  c = ThreeWay(c, p, n, kShort, kShortShift);
  while (n >= 8) {
    c = Crc8(c, p);
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

}  // namespace offloadd
