#pragma once
// Helpers shared by the libFuzzer harnesses (header-only; each harness is one TU).
//
// FUZZ_CHECK(cond): an invariant the parser promises (e.g. offsets inside the buffer after a
// successful parse). A violation is a finding: abort, so libFuzzer saves the input.
//
// SharedDataDir(): the real data files (../shared/data beside the checkout, or
// $OFFLOADD_FUZZ_DATA); harnesses that need a real tokenizer load it from there once.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#ifndef OFFLOADD_FUZZ_SHARED_DATA
#define OFFLOADD_FUZZ_SHARED_DATA "../shared/data"
#endif

#define FUZZ_CHECK(cond)                                                                 \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)

namespace offloadd::fuzz {

// The checkout's root (fuzz/data lives there): $OFFLOADD_FUZZ_SOURCE_DIR when set (harnesses run
// on another machine than the one that built them), else the path the build was configured at.
inline std::string SourceDir() {
  if (const char* env = std::getenv("OFFLOADD_FUZZ_SOURCE_DIR"); env && *env) return env;
#ifdef OFFLOADD_FUZZ_SOURCE_DIR
  return OFFLOADD_FUZZ_SOURCE_DIR;
#else
  return ".";
#endif
}

inline std::string SharedDataDir() {
  if (const char* env = std::getenv("OFFLOADD_FUZZ_DATA"); env && *env) return env;
  return OFFLOADD_FUZZ_SHARED_DATA;
}

// Startup failures of a harness (missing data) are not findings: say why and exit non-zero.
[[noreturn]] inline void SetupFailed(const std::string& what) {
  std::fprintf(stderr, "fuzz harness setup failed: %s\n", what.c_str());
  std::_Exit(2);
}

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

}  // namespace offloadd::fuzz
