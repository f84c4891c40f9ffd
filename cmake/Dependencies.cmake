# System dependencies (installed by scripts/setup.sh, or unpacked into a prefix on the GPU machine
# by scripts/gpu/build_and_test.sh, which then sets CMAKE_PREFIX_PATH).
find_package(Threads REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
find_package(prometheus-cpp CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(Boost 1.74 REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(URING REQUIRED IMPORTED_TARGET liburing)
if(OFFLOADD_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
find_program(OFFLOADD_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# yaml-cpp's exported target name differs between 0.7 (yaml-cpp) and 0.8 (yaml-cpp::yaml-cpp).
if(TARGET yaml-cpp::yaml-cpp)
  set(OFFLOADD_YAML_TARGET yaml-cpp::yaml-cpp)
else()
  set(OFFLOADD_YAML_TARGET yaml-cpp)
endif()

find_package(nlohmann_json 3.10 CONFIG REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(SQLITE3 REQUIRED IMPORTED_TARGET sqlite3)
# sd_notify / sd_watchdog_enabled for the daemon's readiness and watchdog (libsystemd-dev).
pkg_check_modules(LIBSYSTEMD REQUIRED IMPORTED_TARGET libsystemd)
# SentencePiece tokenizer.model files (libsentencepiece-dev). Optional: without it the build
# still works and loading a tokenizer.model is refused naming the missing package.
pkg_check_modules(SENTENCEPIECE IMPORTED_TARGET sentencepiece)
find_package(OpenSSL REQUIRED)
# gzip-compressed datasets (*.jsonl.gz) are inflated with zlib (zlib1g-dev).
find_package(ZLIB REQUIRED)

# CLI11 (header-only) for offloadctl's command line: Debian/Ubuntu package libcli11-dev.
find_path(OFFLOADD_CLI11_INCLUDE_DIR CLI/CLI.hpp)
if(NOT OFFLOADD_CLI11_INCLUDE_DIR)
  message(FATAL_ERROR "CLI11 not found (no CLI/CLI.hpp in the include paths): install the "
                      "Debian/Ubuntu package libcli11-dev (scripts/setup.sh does), or set "
                      "OFFLOADD_CLI11_INCLUDE_DIR to the directory that holds CLI/CLI.hpp")
endif()
add_library(offloadd_cli11 INTERFACE IMPORTED)
target_include_directories(offloadd_cli11 SYSTEM INTERFACE ${OFFLOADD_CLI11_INCLUDE_DIR})
