#pragma once
// CRC-32C (Castagnoli), the checksum the store keeps per chunk and checkpoints per file. Uses the SSE4.2 crc32
// instruction when the CPU has it (checked once at runtime) and a portable slicing-by-8 table
// otherwise. Thread-safe (pure functions).

#include <cstddef>
#include <cstdint>

namespace offloadd {

// Extends `crc` (the value returned for the preceding bytes; 0 to start) with `data`.
// Crc32c(0, "123456789", 9) == 0xE3069283.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);

// The portable and hardware implementations, exposed so tests can check both against vectors.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);
// Falls back to Crc32cPortable when the CPU lacks SSE4.2.
uint32_t Crc32cHardware(uint32_t crc, const void* data, size_t size);
bool Crc32cHardwareAvailable();

}  // namespace offloadd
