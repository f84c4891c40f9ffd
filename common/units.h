#pragma once
// Byte sizes as users write them in configs: 1048576, "1MiB", "24GiB", "512KB".

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace offloadd {

// Accepts a plain integer or a number with one of B, KB, MB, GB, TB (powers of 1000) or
// KiB, MiB, GiB, TiB (powers of 1024), case-insensitive, optional space before the unit.
StatusOr<uint64_t> ParseByteSize(std::string_view text);

// 25769803776 -> "24 GiB"; exact values print with no fraction, others with one decimal.
std::string FormatByteSize(uint64_t bytes);
// Exact and parseable back by ParseByteSize: the largest binary unit that divides `bytes`
// ("24 GiB", "1536 KiB", "1000000000000 B"), for configuration printed back to be re-read.
std::string FormatByteSizeExact(uint64_t bytes);

// The current time, UTC, ISO 8601 to the second: "2026-11-26T15:04:05Z".
std::string NowUtcIso8601();

}  // namespace offloadd
