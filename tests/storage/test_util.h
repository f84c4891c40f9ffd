#pragma once
// Helpers shared by the storage tests: scratch directories on a real disk, deterministic
// tensor contents, and a configurable fault-injecting syscall seam.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "storage/io_engine.h"

namespace offloadd::storage::testing {

// A fresh directory under /var/tmp (a disk filesystem, where O_DIRECT works; /tmp may be
// tmpfs). Removed on destruction.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& root = "") {
    std::string base = root;
    if (base.empty()) {
      const char* env = std::getenv("OFFLOADD_STORAGE_TEST_DIR");
      base = env != nullptr ? env : "/var/tmp";
    }
    std::string tmpl = base + "/offloadd-storage-test-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp under " << base << " failed";
    }
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deterministic bytes for (seed, size): the same call always gives the same tensor.
inline std::vector<std::byte> MakeBytes(uint64_t seed, size_t size) {
  std::vector<std::byte> out(size);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + size);
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < size; ++i) out[i] = static_cast<std::byte>(rng());
  return out;
}

// Faults decided by std::functions the test sets; counts what it did.
class ScriptedFaults : public IoFaults {
 public:
  std::function<int64_t(IoOp, int, uint64_t, uint64_t)> on_transfer;
  std::function<int(int, bool)> on_sync;
  std::function<int(int, uint64_t, uint64_t)> on_allocate;
  std::function<int64_t(uint64_t)> on_manifest_append;
  int ring_setup_error = 0;
  std::atomic<int> injected{0};

  int64_t BeforeTransfer(IoOp op, int dir, uint64_t offset, uint64_t len) override {
    std::lock_guard lock(mu_);
    if (!on_transfer) return 0;
    const int64_t r = on_transfer(op, dir, offset, len);
    if (r != 0) ++injected;
    return r;
  }
  int BeforeSync(int dir, bool manifest) override {
    std::lock_guard lock(mu_);
    if (!on_sync) return 0;
    const int r = on_sync(dir, manifest);
    if (r != 0) ++injected;
    return r;
  }
  int BeforeAllocate(int dir, uint64_t offset, uint64_t len) override {
    std::lock_guard lock(mu_);
    if (!on_allocate) return 0;
    const int r = on_allocate(dir, offset, len);
    if (r != 0) ++injected;
    return r;
  }
  int64_t BeforeManifestAppend(uint64_t len) override {
    std::lock_guard lock(mu_);
    if (!on_manifest_append) return 0;
    const int64_t r = on_manifest_append(len);
    if (r != 0) ++injected;
    return r;
  }
  int BeforeRingSetup() override { return ring_setup_error; }

  // Clears every scripted fault (the test's "disk is healthy again").
  void Heal() {
    std::lock_guard lock(mu_);
    on_transfer = nullptr;
    on_sync = nullptr;
    on_allocate = nullptr;
    on_manifest_append = nullptr;
  }

 private:
  std::mutex mu_;
};

}  // namespace offloadd::storage::testing
