// Faults forced through the IoFaults syscall seam (short transfers, EIO, ENOSPC, torn writes,
// failed syncs, torn manifest appends), on-disk corruption, and the io_uring fallback. In every
// case the failing request gets a clear error, the store stays up, and the last committed
// version of every key reads back bit-identical, also after a reopen.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "storage/format.h"
#include "storage/tensor_store.h"
#include "tests/storage/test_util.h"

namespace offloadd::storage {
namespace {

using testing::MakeBytes;
using testing::ScratchDir;
using testing::ScriptedFaults;

constexpr TensorKey kKey{4, static_cast<uint32_t>(TensorKind::kParamFp32), 0};

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class FaultTest : public ::testing::TestWithParam<IoEngineChoice> {
 protected:
  StoreOptions Options(int n_dirs = 2) {
    StoreOptions o;
    for (int i = 0; i < n_dirs; ++i)
      o.directories.push_back({scratch_.Sub("d" + std::to_string(i))});
    o.block_size = 16 << 10;
    o.queue_depth = 4;
    o.io_engine = GetParam();
    o.faults = &faults_;
    return o;
  }
  std::unique_ptr<TensorStore> Open(const StoreOptions& o) {
    auto s = TensorStore::Open(o);
    if (!s.ok() && s.status().code() == StatusCode::kUnavailable) {
      skip_ = "kernel refuses io_uring: " + s.status().message();
      return nullptr;
    }
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // Asserts `key` reads back as exactly `version` with `bytes`.
  void ExpectCommitted(TensorStore* store, const TensorKey& key, uint64_t version,
                       const std::vector<std::byte>& bytes) {
    std::vector<std::byte> out(bytes.size());
    auto info = store->ReadSync(key, kLatestVersion, out);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->version, version);
    EXPECT_TRUE(out == bytes) << "bytes of " << KeyString(key) << " version " << version
                              << " differ";
  }

  ScratchDir scratch_;
  ScriptedFaults faults_;
  std::string skip_;
};

#define OPEN(var, opts)                              \
  auto var = Open(opts);                             \
  if (!var && !skip_.empty()) GTEST_SKIP() << skip_; \
  ASSERT_NE(var, nullptr)

TEST_P(FaultTest, ShortTransfersAreResubmittedUntilComplete) {
  OPEN(store, Options());
  faults_.on_transfer = [](IoOp, int, uint64_t, uint64_t len) -> int64_t {
    return len >= 8192 ? static_cast<int64_t>(len / 2 / 4096 * 4096) : 0;
  };
  for (size_t size : {size_t{1}, size_t{4097}, size_t{100000}, size_t{16 << 10}, size_t{333333}}) {
    auto v = MakeBytes(size, size);
    ASSERT_TRUE(store->WriteSync({1, 1, static_cast<uint32_t>(size)}, 1, v).ok());
    ExpectCommitted(store.get(), {1, 1, static_cast<uint32_t>(size)}, 1, v);
  }
  EXPECT_GT(faults_.injected.load(), 0);
}

TEST_P(FaultTest, EioOnWriteFailsOnlyThatWriteAndKeepsTheCommittedVersion) {
  const StoreOptions o = Options();
  auto v1 = MakeBytes(1, 200000);
  auto v2 = MakeBytes(2, 200000);
  {
    OPEN(store, o);
    ASSERT_TRUE(store->WriteSync(kKey, 1, v1).ok());
    faults_.on_transfer = [](IoOp op, int dir, uint64_t, uint64_t) -> int64_t {
      return op == IoOp::kWrite && dir == 1 ? -EIO : 0;
    };
    Status st = store->WriteSync(kKey, 2, v2);
    EXPECT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(st.message(), o.directories[1].path)) << st.message();
    EXPECT_TRUE(Contains(st.message(), KeyString(kKey) + " version 2")) << st.message();
    EXPECT_TRUE(Contains(st.message(), "Input/output error")) << st.message();
    ExpectCommitted(store.get(), kKey, 1, v1);
    EXPECT_GE(store->Metrics().directories[1].errors[static_cast<int>(ErrorKind::kIo)], 1u);
    faults_.Heal();
    ASSERT_TRUE(store->WriteSync(kKey, 2, v2).ok());  // the store stayed up
  }
  OPEN(store, o);
  ExpectCommitted(store.get(), kKey, 2, v2);
}

TEST_P(FaultTest, EnospcWhenGrowingOrWritingIsResourceExhaustedNamingTheDirectory) {
  const StoreOptions o = Options();
  OPEN(store, o);
  auto v1 = MakeBytes(1, 100000);
  ASSERT_TRUE(store->WriteSync(kKey, 1, v1).ok());
  faults_.on_allocate = [](int, uint64_t, uint64_t) { return -ENOSPC; };
  Status st = store->WriteSync(kKey, 2, MakeBytes(2, 100000));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_TRUE(Contains(st.message(), "No space left on device")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "store directory " + scratch_.path())) << st.message();
  EXPECT_TRUE(Contains(st.message(), KeyString(kKey))) << st.message();
  faults_.Heal();
  faults_.on_transfer = [](IoOp op, int, uint64_t, uint64_t) -> int64_t {
    return op == IoOp::kWrite ? -ENOSPC : 0;
  };
  st = store->WriteSync(kKey, 2, MakeBytes(2, 100000));
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  ExpectCommitted(store.get(), kKey, 1, v1);
  uint64_t nospace = 0;
  for (const auto& d : store->Metrics().directories)
    nospace += d.errors[static_cast<int>(ErrorKind::kNoSpace)];
  EXPECT_GE(nospace, 2u);
}

TEST_P(FaultTest, TornDataWriteLeavesTheCommittedVersion) {
  const StoreOptions o = Options(1);
  auto v1 = MakeBytes(1, 50000);
  {
    OPEN(store, o);
    ASSERT_TRUE(store->WriteSync(kKey, 1, v1).ok());
    // The device takes the first half of a transfer, then fails: a torn write.
    faults_.on_transfer = [n = 0](IoOp op, int, uint64_t, uint64_t len) mutable -> int64_t {
      if (op != IoOp::kWrite) return 0;
      return n++ == 0 && len >= 8192 ? static_cast<int64_t>(len / 2 / 4096 * 4096) : -EIO;
    };
    EXPECT_FALSE(store->WriteSync(kKey, 2, MakeBytes(2, 50000)).ok());
    ExpectCommitted(store.get(), kKey, 1, v1);
  }
  faults_.Heal();
  OPEN(store, o);
  ExpectCommitted(store.get(), kKey, 1, v1);
}

TEST_P(FaultTest, FailedDataSyncIsNotACommit) {
  const StoreOptions o = Options();
  auto v1 = MakeBytes(1, 70000);
  {
    OPEN(store, o);
    ASSERT_TRUE(store->WriteSync(kKey, 1, v1).ok());
    faults_.on_sync = [](int dir, bool manifest) { return manifest ? 0 : -EIO; };
    Status st = store->WriteSync(kKey, 2, MakeBytes(2, 70000));
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(Contains(st.message(), "fdatasync")) << st.message();
    EXPECT_TRUE(Contains(st.message(), "not committed")) << st.message();
    ExpectCommitted(store.get(), kKey, 1, v1);
  }
  faults_.Heal();
  OPEN(store, o);
  ExpectCommitted(store.get(), kKey, 1, v1);
}

TEST_P(FaultTest, TornOrUnsyncedManifestAppendIsRolledBack) {
  const StoreOptions o = Options();
  auto v1 = MakeBytes(1, 40000);
  auto v3 = MakeBytes(3, 40000);
  {
    OPEN(store, o);
    ASSERT_TRUE(store->WriteSync(kKey, 1, v1).ok());
    faults_.on_manifest_append = [](uint64_t len) -> int64_t {
      return static_cast<int64_t>(len / 3);
    };
    Status st = store->WriteSync(kKey, 2, MakeBytes(2, 40000));
    EXPECT_FALSE(st.ok());
    EXPECT_TRUE(Contains(st.message(), "MANIFEST")) << st.message();
    faults_.Heal();
    faults_.on_sync = [](int, bool manifest) { return manifest ? -EIO : 0; };
    EXPECT_FALSE(store->WriteSync(kKey, 2, MakeBytes(2, 40000)).ok());
    ExpectCommitted(store.get(), kKey, 1, v1);
    faults_.Heal();
    // Later appends land after the last good record, so they replay.
    ASSERT_TRUE(store->WriteSync(kKey, 3, v3).ok());
  }
  OPEN(store, o);
  ExpectCommitted(store.get(), kKey, 3, v3);
}

TEST_P(FaultTest, EioAndChecksumMismatchOnReadAreClearErrors) {
  const StoreOptions o = Options(1);
  auto v1 = MakeBytes(1, 3 * 16384 + 5);
  auto other = MakeBytes(9, 1000);
  const TensorKey other_key{9, 1, 0};
  {
    OPEN(store, o);
    ASSERT_TRUE(store->WriteSync(kKey, 1, v1).ok());
    ASSERT_TRUE(store->WriteSync(other_key, 1, other).ok());
    faults_.on_transfer = [](IoOp op, int, uint64_t, uint64_t) -> int64_t {
      return op == IoOp::kRead ? -EIO : 0;
    };
    std::vector<std::byte> out(v1.size());
    Status st = store->ReadSync(kKey, 1, out).status();
    EXPECT_EQ(st.code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(st.message(), o.directories[0].path)) << st.message();
    EXPECT_TRUE(Contains(st.message(), "read of " + KeyString(kKey))) << st.message();
    faults_.Heal();
    ExpectCommitted(store.get(), kKey, 1, v1);
  }
  // Flip one byte inside the first chunk of kKey on disk (it was written first, at offset 0).
  const std::string data = o.directories[0].path + "/data";
  const int fd = ::open(data.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, 100), 1);
  b ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &b, 1, 100), 1);
  ::fsync(fd);
  ::close(fd);
  OPEN(store, o);
  std::vector<std::byte> out(v1.size());
  Status st = store->ReadSync(kKey, 1, out).status();
  EXPECT_EQ(st.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(st.message(), "checksum mismatch")) << st.message();
  EXPECT_TRUE(Contains(st.message(), data.substr(0, data.size() - 5))) << st.message();
  EXPECT_TRUE(Contains(st.message(), KeyString(kKey))) << st.message();
  EXPECT_EQ(store->Metrics().directories[0].errors[static_cast<int>(ErrorKind::kChecksum)], 1u);
  ExpectCommitted(store.get(), other_key, 1, other);  // the store stays up
}

TEST_P(FaultTest, TornManifestTailFromACrashIsDroppedAtOpen) {
  const StoreOptions o = Options();
  auto a = MakeBytes(1, 30000);
  auto b = MakeBytes(2, 30000);
  {
    OPEN(store, o);
    ASSERT_TRUE(store->WriteSync({0, 1, 0}, 1, a).ok());
    ASSERT_TRUE(store->WriteSync({1, 1, 0}, 1, b).ok());
  }
  // What a crash in the middle of an append leaves: the first bytes of a record.
  ManifestEntry e;
  e.record.key = {0, 1, 0};
  e.record.version = 2;
  e.record.size = 30000;
  e.record.chunk_bytes = 16384;
  e.record.extents = {{0, 1 << 20, 16384}, {1, 1 << 20, 16384}};
  e.record.chunks = {{0, 1}, {1, 2}};
  std::vector<uint8_t> rec;
  EncodeRecord(e, &rec);
  const std::string manifest = o.directories[0].path + "/MANIFEST";
  const int fd = ::open(manifest.c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, rec.data(), rec.size() - 7), static_cast<ssize_t>(rec.size() - 7));
  ::close(fd);
  {
    OPEN(store, o);
    ExpectCommitted(store.get(), {0, 1, 0}, 1, a);
    ExpectCommitted(store.get(), {1, 1, 0}, 1, b);
    ASSERT_TRUE(store->WriteSync({0, 1, 0}, 2, b).ok());
  }
  OPEN(store, o);
  ExpectCommitted(store.get(), {0, 1, 0}, 2, b);
}

TEST_P(FaultTest, CorruptionInsideTheManifestRefusesToOpen) {
  const StoreOptions o = Options(1);
  {
    OPEN(store, o);
    for (uint64_t v = 1; v <= 3; ++v)
      ASSERT_TRUE(store->WriteSync(kKey, v, MakeBytes(v, 5000)).ok());
  }
  const std::string manifest = o.directories[0].path + "/MANIFEST";
  const int fd = ::open(manifest.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, 20), 1);
  b ^= 1;
  ASSERT_EQ(::pwrite(fd, &b, 1, 20), 1);
  ::close(fd);
  auto s = TensorStore::Open(o);
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
  EXPECT_TRUE(Contains(s.status().message(), "refusing to truncate")) << s.status().message();
}

TEST_P(FaultTest, TruncatedDataFileRefusesToOpenNamingDirectoryAndKey) {
  const StoreOptions o = Options();
  {
    OPEN(store, o);
    ASSERT_TRUE(store->WriteSync(kKey, 1, MakeBytes(1, 100000)).ok());
  }
  const std::string data = o.directories[1].path + "/data";
  ASSERT_EQ(::truncate(data.c_str(), 0), 0);
  auto s = TensorStore::Open(o);
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status().ToString();
  EXPECT_TRUE(Contains(s.status().message(), o.directories[1].path)) << s.status().message();
  EXPECT_TRUE(Contains(s.status().message(), KeyString(kKey))) << s.status().message();
}

TEST_P(FaultTest, ManifestCompactionKeepsLatestVersions) {
  StoreOptions o = Options();
  o.manifest_compact_bytes = 2048;
  {
    OPEN(store, o);
    for (uint64_t v = 1; v <= 60; ++v) {
      for (uint32_t k = 0; k < 3; ++k)
        ASSERT_TRUE(store->WriteSync({k, 2, 0}, v, MakeBytes(v * 10 + k, 20000)).ok());
    }
    EXPECT_LT(store->Metrics().manifest_bytes, 8192u);
  }
  OPEN(store, o);
  for (uint32_t k = 0; k < 3; ++k)
    ExpectCommitted(store.get(), {k, 2, 0}, 60, MakeBytes(600 + k, 20000));
}

}  // namespace

// Readable test names in ctest output ("Threads" instead of a byte dump).
void PrintTo(IoEngineChoice c, std::ostream* os) {
  *os << (c == IoEngineChoice::kThreads   ? "threads"
          : c == IoEngineChoice::kIoUring ? "io_uring"
                                          : "auto");
}

namespace {

INSTANTIATE_TEST_SUITE_P(Engines, FaultTest,
                         ::testing::Values(IoEngineChoice::kIoUring, IoEngineChoice::kThreads),
                         [](const auto& param_info) {
                           return param_info.param == IoEngineChoice::kThreads
                                      ? std::string("Threads")
                                      : std::string("IoUring");
                         });

TEST(FallbackTest, RefusedIoUringFallsBackToThreadPool) {
  ScratchDir scratch;
  ScriptedFaults faults;
  faults.ring_setup_error = -EPERM;
  StoreOptions o;
  o.directories = {{scratch.Sub("a")}, {scratch.Sub("b")}};
  o.block_size = 8192;
  o.faults = &faults;
  o.io_engine = IoEngineChoice::kIoUring;
  auto strict = TensorStore::Open(o);
  EXPECT_EQ(strict.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(strict.status().message(), "io_uring")) << strict.status().message();
  strict = Status(StatusCode::kCancelled, "closed");

  o.io_engine = IoEngineChoice::kAuto;
  auto s = TensorStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->engine_name(), "threads");
  EXPECT_EQ((*s)->Metrics().engine, "threads");
  auto v = MakeBytes(1, 123457);
  ASSERT_TRUE((*s)->WriteSync(kKey, 1, v).ok());
  std::vector<std::byte> out(v.size());
  ASSERT_TRUE((*s)->ReadSync(kKey, 1, out).ok());
  EXPECT_EQ(out, v);
}

}  // namespace
}  // namespace offloadd::storage
