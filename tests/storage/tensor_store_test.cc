// TensorStore round trips, versioning and striping, on both I/O engines.
#include "storage/tensor_store.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <random>

#include "ipc/shm_segment.h"
#include "tests/storage/test_util.h"

namespace offloadd::storage {
namespace {

using testing::MakeBytes;
using testing::ScratchDir;

struct AlignedDeleter {
  void operator()(std::byte* p) const { std::free(p); }
};

// A buffer whose data starts `misalign` bytes after a 4 KiB boundary.
class Buffer {
 public:
  Buffer(size_t size, size_t misalign)
      : mem_(static_cast<std::byte*>(std::aligned_alloc(4096, AlignUp(size + misalign + 1)))),
        data_(mem_.get() + misalign),
        size_(size) {}
  std::span<std::byte> span() { return {data_, size_}; }

 private:
  std::unique_ptr<std::byte, AlignedDeleter> mem_;
  std::byte* data_;
  size_t size_;
};

class TensorStoreTest : public ::testing::TestWithParam<IoEngineChoice> {
 protected:
  StoreOptions Options(std::vector<StoreDirectory> dirs) {
    StoreOptions o;
    o.directories = std::move(dirs);
    o.block_size = 64 << 10;
    o.queue_depth = 8;
    o.io_engine = GetParam();
    return o;
  }
  std::unique_ptr<TensorStore> OpenOrSkip(const StoreOptions& o) {
    auto s = TensorStore::Open(o);
    if (!s.ok() && GetParam() == IoEngineChoice::kIoUring &&
        s.status().code() == StatusCode::kUnavailable) {
      skip_reason_ = "kernel refuses io_uring: " + s.status().message();
      return nullptr;
    }
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::string skip_reason_;
  ScratchDir scratch_;
};

#define OPEN_OR_SKIP(var, opts)                                    \
  auto var = OpenOrSkip(opts);                                     \
  if (!var && !skip_reason_.empty()) GTEST_SKIP() << skip_reason_; \
  ASSERT_NE(var, nullptr)

TEST_P(TensorStoreTest, RoundTripsOddSizesAndOffsetsAcrossReopen) {
  const StoreOptions o = Options({{scratch_.Sub("a"), 1.0}, {scratch_.Sub("b"), 2.0}});
  const size_t bs = o.block_size;
  const std::vector<size_t> sizes = {0,      1,  7,      4095,         4096,           4097,
                                     bs - 1, bs, bs + 1, 3 * bs + 123, 17 * bs + 4096, 1234567};
  const std::vector<size_t> misaligns = {0, 1, 8, 100, 4095};
  {
    OPEN_OR_SKIP(store, o);
    EXPECT_EQ(store->engine_name(),
              GetParam() == IoEngineChoice::kThreads ? "threads" : "io_uring");
    for (size_t i = 0; i < sizes.size(); ++i) {
      for (size_t m = 0; m < misaligns.size(); ++m) {
        const TensorKey key{static_cast<uint32_t>(i), static_cast<uint32_t>(TensorKind::kAdamM),
                            static_cast<uint32_t>(m)};
        for (uint64_t version = 1; version <= 2; ++version) {
          Buffer src(sizes[i], misaligns[m]);
          auto bytes = MakeBytes(i * 1000 + m * 10 + version, sizes[i]);
          if (!bytes.empty()) std::memcpy(src.span().data(), bytes.data(), bytes.size());
          ASSERT_TRUE(store->WriteSync(key, version, src.span()).ok()) << KeyString(key);
          Buffer dst(sizes[i], misaligns[(m + 1) % misaligns.size()]);
          auto info = store->ReadSync(key, kLatestVersion, dst.span());
          ASSERT_TRUE(info.ok()) << info.status().ToString();
          EXPECT_EQ(info->version, version);
          EXPECT_EQ(info->size, sizes[i]);
          ASSERT_TRUE(bytes.empty() ||
                      std::memcmp(dst.span().data(), bytes.data(), bytes.size()) == 0)
              << "size " << sizes[i] << " misalign " << misaligns[m];
        }
      }
    }
    EXPECT_EQ(store->List().size(), sizes.size() * misaligns.size());
  }
  // Reopen: every key is at version 2 with the same bytes.
  OPEN_OR_SKIP(store, o);
  for (size_t i = 0; i < sizes.size(); ++i) {
    for (size_t m = 0; m < misaligns.size(); ++m) {
      const TensorKey key{static_cast<uint32_t>(i), static_cast<uint32_t>(TensorKind::kAdamM),
                          static_cast<uint32_t>(m)};
      std::vector<std::byte> out(sizes[i]);
      auto info = store->ReadSync(key, 2, out);
      ASSERT_TRUE(info.ok()) << info.status().ToString();
      EXPECT_EQ(out, MakeBytes(i * 1000 + m * 10 + 2, sizes[i]));
    }
  }
}

TEST_P(TensorStoreTest, ReadsAndWritesInFlightTogether) {
  OPEN_OR_SKIP(store, Options({{scratch_.Sub("a")}, {scratch_.Sub("b")}}));
  constexpr int kKeys = 24;
  constexpr size_t kSize = 300 * 1024 + 17;
  std::vector<std::vector<std::byte>> v1(kKeys), v2(kKeys),
      out(kKeys, std::vector<std::byte>(kSize));
  for (int k = 0; k < kKeys; ++k) {
    v1[k] = MakeBytes(k, kSize);
    v2[k] = MakeBytes(k + 100, kSize);
    ASSERT_TRUE(store->WriteSync({static_cast<uint32_t>(k), 1, 0}, 1, v1[k]).ok());
  }
  // Version 2 writes and reads of version 1 of the same keys, all submitted before any waits.
  std::vector<std::promise<Status>> writes(kKeys);
  std::vector<std::promise<StatusOr<TensorInfo>>> reads(kKeys);
  for (int k = 0; k < kKeys; ++k) {
    store->Read({static_cast<uint32_t>(k), 1, 0}, 1, out[k],
                [&reads, k](StatusOr<TensorInfo> r) { reads[k].set_value(std::move(r)); });
    store->Write({static_cast<uint32_t>(k), 1, 0}, 2, v2[k],
                 [&writes, k](Status s) { writes[k].set_value(std::move(s)); });
  }
  for (int k = 0; k < kKeys; ++k) {
    auto r = reads[k].get_future().get();
    // The read raced with the commit of version 2: it either saw version 1 intact or was
    // submitted after the commit and was refused (version 1 is no longer stored).
    if (r.ok()) {
      EXPECT_EQ(out[k], v1[k]) << "key " << k;
    } else {
      EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
    }
    EXPECT_TRUE(writes[k].get_future().get().ok());
  }
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_TRUE(store->ReadSync({static_cast<uint32_t>(k), 1, 0}, 2, out[k]).ok());
    EXPECT_EQ(out[k], v2[k]);
  }
}

TEST_P(TensorStoreTest, StripesByWeight) {
  OPEN_OR_SKIP(store, Options({{scratch_.Sub("a"), 1.0}, {scratch_.Sub("b"), 3.0}}));
  const size_t bs = store->options().block_size;
  auto data = MakeBytes(1, 400 * bs);
  ASSERT_TRUE(store->WriteSync({0, 1, 0}, 1, data).ok());
  const StoreMetrics m = store->Metrics();
  ASSERT_EQ(m.directories.size(), 2u);
  EXPECT_EQ(m.directories[0].bytes_written + m.directories[1].bytes_written, data.size());
  EXPECT_EQ(m.directories[0].write_ops, 100u);
  EXPECT_EQ(m.directories[1].write_ops, 300u);
  EXPECT_EQ(m.directories[0].live_bytes, 100 * bs);
  EXPECT_EQ(m.stored_bytes, data.size());
  EXPECT_EQ(m.tensors, 1u);
  EXPECT_EQ(m.commits, 1u);
  EXPECT_EQ(m.commit_latency.count, 1u);
  EXPECT_GE(m.directories[1].syncs, 1u);
  EXPECT_EQ(m.directories[1].write_latency.count, 300u);
}

TEST_P(TensorStoreTest, RegisteredSharedArenaRoundTrip) {
  auto seg = ipc::SharedSegment::Create(8 << 20);
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  StoreOptions o = Options({{scratch_.Sub("a")}});
  o.registered_buffers = {
      std::span<std::byte>(reinterpret_cast<std::byte*>(seg->data()), seg->data_size())};
  OPEN_OR_SKIP(store, o);
  auto data = MakeBytes(5, 3 << 20);
  auto* arena = reinterpret_cast<std::byte*>(seg->data());
  std::memcpy(arena, data.data(), data.size());
  ASSERT_TRUE(store->WriteSync({1, 2, 3}, 7, {arena, data.size()}).ok());
  std::memset(arena + (4 << 20), 0, data.size());
  ASSERT_TRUE(store->ReadSync({1, 2, 3}, 7, {arena + (4 << 20), data.size()}).ok());
  EXPECT_EQ(std::memcmp(arena + (4 << 20), data.data(), data.size()), 0);
}

TEST_P(TensorStoreTest, RejectsBadRequestsWithClearErrors) {
  OPEN_OR_SKIP(store, Options({{scratch_.Sub("a")}}));
  auto data = MakeBytes(1, 10000);
  const TensorKey key{3, static_cast<uint32_t>(TensorKind::kAdamV), 0};
  std::vector<std::byte> out(10000);
  Status st = store->ReadSync(key, kLatestVersion, out).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("(layer 3, adam_v, part 0)"), std::string::npos) << st.message();

  ASSERT_TRUE(store->WriteSync(key, 5, data).ok());
  st = store->WriteSync(key, 5, data);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not newer than the committed version 5"), std::string::npos);

  std::vector<std::byte> small(9999);
  st = store->ReadSync(key, 5, small).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("10000"), std::string::npos) << st.message();

  st = store->ReadSync(key, 4, out).status();
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("committed version is 5"), std::string::npos) << st.message();

  // A second write of a key while one is in flight is refused, the first still commits.
  std::promise<Status> first;
  store->Write(key, 6, data, [&](Status s) { first.set_value(s); });
  std::promise<Status> second;
  store->Write(key, 7, data, [&](Status s) { second.set_value(s); });
  Status s2 = second.get_future().get();
  Status s1 = first.get_future().get();
  EXPECT_TRUE(s1.ok()) << s1.ToString();
  // The second may have arrived after the first committed; then it is simply version 7.
  if (!s2.ok()) {
    EXPECT_EQ(s2.code(), StatusCode::kFailedPrecondition) << s2.ToString();
  }

  ASSERT_TRUE(store->Drop(key).ok());
  EXPECT_FALSE(store->Lookup(key).has_value());
  EXPECT_EQ(store->Drop(key).code(), StatusCode::kNotFound);
}

TEST_P(TensorStoreTest, SpaceIsReusedAfterNewVersionsCommit) {
  OPEN_OR_SKIP(store, Options({{scratch_.Sub("a")}}));
  auto data = MakeBytes(9, 1 << 20);
  for (uint64_t v = 1; v <= 20; ++v) ASSERT_TRUE(store->WriteSync({0, 1, 0}, v, data).ok());
  // Two versions' worth at most: the committed one and the one being written.
  EXPECT_LE(store->Metrics().directories[0].file_bytes, 2u << 20);
}

}  // namespace

void PrintTo(IoEngineChoice c, std::ostream* os) {
  *os << (c == IoEngineChoice::kThreads   ? "threads"
          : c == IoEngineChoice::kIoUring ? "io_uring"
                                          : "auto");
}

namespace {

INSTANTIATE_TEST_SUITE_P(Engines, TensorStoreTest,
                         ::testing::Values(IoEngineChoice::kIoUring, IoEngineChoice::kThreads),
                         [](const auto& param_info) {
                           return param_info.param == IoEngineChoice::kThreads
                                      ? std::string("Threads")
                                      : std::string("IoUring");
                         });

TEST(TensorStoreOpenTest, RejectsInvalidOptions) {
  StoreOptions o;
  EXPECT_EQ(TensorStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  ScratchDir scratch;
  o.directories = {{scratch.Sub("a")}};
  o.block_size = 1000;
  auto s = TensorStore::Open(o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("aio.block_size"), std::string::npos);
  o.block_size = 4096;
  o.queue_depth = 0;
  EXPECT_NE(TensorStore::Open(o).status().message().find("aio.queue_depth"), std::string::npos);
  o.queue_depth = 4;
  o.directories = {{scratch.Sub("a")}, {scratch.Sub("a")}};
  EXPECT_NE(TensorStore::Open(o).status().message().find("listed twice"), std::string::npos);
  o.directories = {{scratch.Sub("a"), -1}};
  EXPECT_NE(TensorStore::Open(o).status().message().find("weight"), std::string::npos);
}

TEST(TensorStoreOpenTest, DirectoryIdentityAndLocking) {
  ScratchDir scratch;
  StoreOptions o;
  o.directories = {{scratch.Sub("a")}, {scratch.Sub("b")}};
  o.block_size = 4096;
  {
    auto s = TensorStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->WriteSync({0, 1, 0}, 1, MakeBytes(1, 50000)).ok());
    // A second store on the same directories is refused while the first runs.
    auto again = TensorStore::Open(o);
    EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(again.status().message().find("in use by another"), std::string::npos);
  }
  StoreOptions swapped = o;
  std::swap(swapped.directories[0], swapped.directories[1]);
  auto s = TensorStore::Open(swapped);
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("original order"), std::string::npos) << s.status().message();

  StoreOptions fewer = o;
  fewer.directories.pop_back();
  EXPECT_EQ(TensorStore::Open(fewer).status().code(), StatusCode::kFailedPrecondition);

  StoreOptions more = o;
  more.directories.push_back({scratch.Sub("c")});
  s = TensorStore::Open(more);
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find(scratch.Sub("c")), std::string::npos) << s.status().message();
}

TEST(TensorStoreOpenTest, TmpfsAndBufferedMode) {
  if (!std::filesystem::exists("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  ScratchDir scratch("/dev/shm");
  StoreOptions o;
  o.directories = {{scratch.Sub("a")}};
  o.block_size = 4096;
  o.direct_io = DirectIoMode::kOn;
  auto strict = TensorStore::Open(o);
  const bool refused = !strict.ok();
  if (refused) {
    EXPECT_EQ(strict.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(strict.status().message().find("O_DIRECT"), std::string::npos);
  }
  strict = Status(StatusCode::kCancelled, "closed");
  o.direct_io = DirectIoMode::kAuto;
  auto s = TensorStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->direct_io(0), !refused);
  auto data = MakeBytes(3, 12345);
  ASSERT_TRUE((*s)->WriteSync({0, 0, 0}, 1, data).ok());
  std::vector<std::byte> out(data.size());
  ASSERT_TRUE((*s)->ReadSync({0, 0, 0}, 1, out).ok());
  EXPECT_EQ(out, data);
  s = Status(StatusCode::kCancelled, "closed");

  // Buffered mode, as chosen where O_DIRECT is refused, also round-trips across a reopen.
  o.direct_io = DirectIoMode::kOff;
  s = TensorStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_FALSE((*s)->direct_io(0));
  std::fill(out.begin(), out.end(), std::byte{0});
  ASSERT_TRUE((*s)->ReadSync({0, 0, 0}, 1, out).ok());
  EXPECT_EQ(out, data);
  auto odd = MakeBytes(4, 4097);
  ASSERT_TRUE((*s)->WriteSync({0, 0, 0}, 2, odd).ok());
  out.resize(odd.size());
  ASSERT_TRUE((*s)->ReadSync({0, 0, 0}, 2, out).ok());
  EXPECT_EQ(out, odd);
}

}  // namespace
}  // namespace offloadd::storage
