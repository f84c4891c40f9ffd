#include "common/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <limits>

namespace offloadd {

StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  std::string s;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  }
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return InvalidArgumentError("'" + std::string(text) + "' is not a byte size (e.g. 4096, 512MiB, 24GiB)");
  const std::string number = s.substr(0, i);
  std::string unit = s.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult = 0;
  if (unit.empty() || unit == "b") mult = 1;
  else if (unit == "kb") mult = 1e3;
  else if (unit == "mb") mult = 1e6;
  else if (unit == "gb") mult = 1e9;
  else if (unit == "tb") mult = 1e12;
  else if (unit == "kib" || unit == "k") mult = 1024.0;
  else if (unit == "mib" || unit == "m") mult = 1024.0 * 1024;
  else if (unit == "gib" || unit == "g") mult = 1024.0 * 1024 * 1024;
  else if (unit == "tib" || unit == "t") mult = 1024.0 * 1024 * 1024 * 1024;
  else return InvalidArgumentError("unknown size unit '" + unit + "' in '" + std::string(text) + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(v)) {
    return InvalidArgumentError("'" + std::string(text) + "' is not a byte size");
  }
  const double bytes = v * mult;
  if (bytes >= static_cast<double>(std::numeric_limits<uint64_t>::max())) {
    return OutOfRangeError("byte size '" + std::string(text) + "' is too large");
  }
  if (bytes != std::floor(bytes)) {
    return InvalidArgumentError("byte size '" + std::string(text) + "' is not a whole number of bytes");
  }
  return static_cast<uint64_t>(bytes);
}

std::string FormatByteSizeExact(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};  // ParseByteSize's
  int u = 0;
  while (bytes != 0 && bytes % 1024 == 0 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + " " + kUnits[u];
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (v == std::floor(v)) std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string NowUtcIso8601() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace offloadd
