# Included by the top-level CMakeLists.txt before any component when OFFLOADD_FUZZ is ON: every
# target of this build directory gets libFuzzer's coverage instrumentation and ASan+UBSan, so the
# harnesses in fuzz/ see (and check) the real parsers, not uninstrumented copies.
# Configure with clang (scripts/fuzz.sh does): CC=clang CXX=clang++.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "OFFLOADD_FUZZ=ON needs clang (libFuzzer); configure with "
                      "CC=clang CXX=clang++ (scripts/fuzz.sh does), got ${CMAKE_CXX_COMPILER_ID}")
endif()
# -fno-sanitize-recover: a UBSan finding is a crash the fuzzer saves, not a line in a log.
set(OFFLOADD_SANITIZE_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer)
add_compile_options(-fsanitize=fuzzer-no-link ${OFFLOADD_SANITIZE_FLAGS})
add_link_options(${OFFLOADD_SANITIZE_FLAGS})
# The harnesses need none of the tests, LibTorch targets or CUDA; they are configured but never
# built (scripts/fuzz.sh builds the offloadd_fuzzers target only).
