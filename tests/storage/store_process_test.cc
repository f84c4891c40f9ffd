// The real offloadd-store binary driven through the ipc rings: round trips, bad requests, the
// metrics endpoint, and kill -9 in the middle of writes followed by a restart in which every
// acknowledged (committed) version reads back bit-identical.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "ipc/arena.h"
#include "ipc/liveness.h"
#include "ipc/shm_segment.h"
#include "storage/store_client.h"
#include "tests/storage/test_util.h"

namespace offloadd::storage {
namespace {

using testing::MakeBytes;
using testing::ScratchDir;

class StoreProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto seg = ipc::SharedSegment::Create(96 << 20, {.name = "store-test"});
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    segment_ = std::move(*seg);
    auto arena = ipc::Arena::Format(&segment_);
    ASSERT_TRUE(arena.ok()) << arena.status().ToString();
    arena_ = *arena;
  }

  StoreProcessOptions Options(std::vector<std::string> extra = {}) {
    StoreProcessOptions o;
    o.binary = OFFLOADD_STORE_BINARY;
    o.args = {"--dir=" + scratch_.Sub("nvme0"), "--dir=" + scratch_.Sub("nvme1") + ":2",
              "--block-size=256KiB", "--queue-depth=8", "--log-level=warning"};
    o.args.insert(o.args.end(), extra.begin(), extra.end());
    return o;
  }

  ipc::Region Region(const std::string& name, uint64_t bytes) {
    auto r = arena_.Allocate(name, ipc::RegionKind::kIoBuffer, bytes);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *r;
  }

  // Submits one command and waits for its completion (no other command in flight).
  Completion Call(StoreProcess* p, StoreOp op, const StoreCommand& cmd) {
    const uint64_t id = ++next_id_;
    EXPECT_TRUE(p->Submit(op, id, cmd, 60000).ok());
    auto c = p->NextCompletion(60000);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (!c.ok()) return {};
    EXPECT_EQ(c->id, id);
    return *c;
  }

  void KillNineRounds(const std::vector<std::string>& extra);

  ScratchDir scratch_;
  ipc::SharedSegment segment_;
  ipc::Arena arena_;
  uint64_t next_id_ = 0;
};

StoreCommand Cmd(TensorKey k, uint64_t version, const ipc::Region& r, uint64_t bytes) {
  StoreCommand c;
  c.layer = k.layer;
  c.kind = k.kind;
  c.part = k.part;
  c.version = version;
  c.offset = r.offset;
  c.bytes = bytes;
  return c;
}

TEST_F(StoreProcessTest, RoundTripsThroughTheRingsAndRejectsBadOffsets) {
  auto p = StoreProcess::Launch(segment_, &arena_, Options());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const size_t size = 1234567;
  ipc::Region src = Region("src", size), dst = Region("dst", size);
  auto bytes = MakeBytes(42, size);
  std::memcpy(arena_.At<void>(src.offset), bytes.data(), size);
  const TensorKey key{7, static_cast<uint32_t>(TensorKind::kAdamV), 1};
  Completion c = Call(p->get(), StoreOp::kWrite, Cmd(key, 3, src, size));
  ASSERT_TRUE(c.status().ok()) << c.status().ToString();
  c = Call(p->get(), StoreOp::kRead, Cmd(key, kLatestVersion, dst, size));
  ASSERT_TRUE(c.status().ok()) << c.status().ToString();
  EXPECT_EQ(c.body.version, 3u);
  EXPECT_EQ(std::memcmp(arena_.At<void>(dst.offset), bytes.data(), size), 0);

  // An offset outside every region is refused before any I/O.
  StoreCommand bad = Cmd(key, 4, src, size);
  bad.offset = segment_.total_size() - 10;
  c = Call(p->get(), StoreOp::kWrite, bad);
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfRange) << c.status().ToString();
  EXPECT_NE(c.body.text().find("not inside any live region"), std::string_view::npos)
      << c.body.text();
  c = Call(p->get(), StoreOp::kRead, Cmd({99, 1, 0}, kLatestVersion, dst, size));
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.body.text().find("(layer 99"), std::string_view::npos) << c.body.text();
  c = Call(p->get(), StoreOp::kDrop, Cmd(key, 0, src, 0));
  EXPECT_TRUE(c.status().ok()) << c.status().ToString();
  // The client's view (the daemon's per-job store metrics): 5 requests, 2 of them errors, none
  // in flight, every latency in a bucket and the sum positive.
  const StoreClientStats st = (*p)->Stats();
  EXPECT_EQ(st.submitted, 5u);
  EXPECT_EQ(st.completed, 5u);
  EXPECT_EQ(st.errors, 2u);
  EXPECT_EQ(st.in_flight, 0u);
  ASSERT_EQ(st.latency_counts.size(), st.latency_bounds_seconds.size() + 1);
  uint64_t counted = 0;
  for (uint64_t n : st.latency_counts) counted += n;
  EXPECT_EQ(counted, 5u);
  EXPECT_GT(st.latency_sum_seconds, 0);
  EXPECT_TRUE((*p)->Shutdown().ok());
  EXPECT_EQ((*p)->Stats().submitted, 5u) << "the shutdown command is not a request";
}

// A stopped store (SIGSTOP: its pidfd never fires, as a store wedged in D-state
// I/O) is killed once the commands in flight are past the liveness deadline, and the wait returns
// UNAVAILABLE naming the store and the watchdog (which the daemon restarts the job after).
TEST_F(StoreProcessTest, AStoppedStoreIsKilledByTheLivenessDeadline) {
  ipc::SetLivenessPolicy(/*floor_seconds=*/0.3, /*factor=*/10);
  ipc::SetLivenessRates(0, /*store_bytes_per_second=*/1e9);
  auto p = StoreProcess::Launch(segment_, &arena_, Options());
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const size_t size = 65536;
  ipc::Region src = Region("src", size);
  ASSERT_EQ(::kill((*p)->pid(), SIGSTOP), 0);
  const TensorKey key{1, static_cast<uint32_t>(TensorKind::kAdamM), 0};
  ASSERT_TRUE((*p)->Submit(StoreOp::kWrite, 1, Cmd(key, 1, src, size)).ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto c = (*p)->NextCompletion();  // no timeout of its own: the liveness deadline ends it
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  const std::string pid = std::to_string((*p)->pid());
  EXPECT_NE(c.status().message().find(std::string(kStoreDiedSign) + pid + ") killed by the liveness watchdog"),
            std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("1 command(s) (65536 bytes) in flight"), std::string::npos)
      << c.status().message();
  EXPECT_EQ((*p)->Stats().watchdog_kills, 1u);
  // Without work in flight there is nothing to wait for: no deadline, a plain timeout.
  auto idle = StoreProcess::Launch(segment_, &arena_, Options());
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  EXPECT_EQ((*idle)->NextCompletion(500).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE((*idle)->Shutdown().ok());
  ipc::SetLivenessPolicy(0, 10);  // the other tests: no deadlines
}

TEST_F(StoreProcessTest, OpenErrorsComeBackThroughTheHandshake) {
  auto o = Options({"--direct-io=on"});
  // A file where a directory should be.
  const std::string file = scratch_.Sub("not-a-dir");
  std::FILE* f = std::fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  o.args = {"--dir=" + file, "--log-level=error"};
  auto p = StoreProcess::Launch(segment_, &arena_, o);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition) << p.status().ToString();
  EXPECT_NE(p.status().message().find("not a directory"), std::string::npos)
      << p.status().message();

  o.binary = scratch_.Sub("no-such-binary");
  p = StoreProcess::Launch(segment_, &arena_, o);
  EXPECT_EQ(p.status().code(), StatusCode::kUnavailable) << p.status().ToString();
  EXPECT_NE(p.status().message().find("could not be executed"), std::string::npos)
      << p.status().message();
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    return "";
  }
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? out : out.substr(body + 4);
}

TEST_F(StoreProcessTest, ServesPrometheusMetricsThatPromtoolAccepts) {
  auto p = StoreProcess::Launch(segment_, &arena_, Options({"--metrics-listen=127.0.0.1:0"}));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_GT((*p)->metrics_port(), 0);
  ipc::Region src = Region("m.src", 600000);
  ASSERT_TRUE(Call(p->get(), StoreOp::kWrite, Cmd({1, 1, 0}, 1, src, 600000)).status().ok());
  const std::string text = HttpGet((*p)->metrics_port(), "/metrics");
  for (const char* name :
       {"offloadd_store_written_bytes_total", "offloadd_store_io_latency_seconds_bucket",
        "offloadd_store_errors_total", "offloadd_store_queue_depth",
        "offloadd_store_stored_bytes 600000", "offloadd_store_commits_total 1"}) {
    EXPECT_NE(text.find(name), std::string::npos) << name << " missing from:\n"
                                                  << text.substr(0, 2000);
  }
  if (::system("command -v promtool >/dev/null 2>&1") == 0) {
    const std::string path = scratch_.Sub("metrics.txt");
    std::FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    EXPECT_EQ(::system(("promtool check metrics < " + path).c_str()), 0);
  }
  EXPECT_TRUE((*p)->Shutdown().ok());
}

// kill -9 while writes are in flight, restart, check; `extra` selects the engine.
void StoreProcessTest::KillNineRounds(const std::vector<std::string>& extra) {
  constexpr int kKeys = 6;
  constexpr size_t kSize = 1000000 + 4097;  // odd: a partial last chunk on some directory
  std::vector<ipc::Region> src;
  for (int k = 0; k < kKeys; ++k) src.push_back(Region("crash.src." + std::to_string(k), kSize));
  ipc::Region dst = Region("crash.dst", kSize);
  auto key_of = [](int k) {
    return TensorKey{static_cast<uint32_t>(k), static_cast<uint32_t>(TensorKind::kParamFp32), 0};
  };
  auto content_seed = [](int k, uint64_t v) { return uint64_t(k) * 1000003 + v; };

  std::map<int, uint64_t> acked;      // highest version whose write completed OK
  std::map<int, uint64_t> submitted;  // highest version ever submitted
  std::mt19937 rng(1234);
  uint64_t id = 0;
  for (int round = 0; round < 5; ++round) {
    auto p = StoreProcess::Launch(segment_, &arena_, Options(extra));
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    // Verify what the previous round left: for every key, a version in [acked, submitted] whose
    // bytes are exactly that version's.
    for (int k = 0; k < kKeys && round > 0; ++k) {
      ASSERT_TRUE(
          (*p)->Submit(StoreOp::kRead, ++id, Cmd(key_of(k), kLatestVersion, dst, kSize), 60000)
              .ok());
      auto c = (*p)->NextCompletion(60000);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      if (acked.count(k) == 0) {
        // Never acknowledged: may be absent or any submitted version.
        if (!c->status().ok()) {
          EXPECT_EQ(c->status().code(), StatusCode::kNotFound) << c->status().ToString();
          continue;
        }
      }
      ASSERT_TRUE(c->status().ok()) << "key " << k << ": " << c->status().ToString();
      const uint64_t v = c->body.version;
      EXPECT_GE(v, acked[k]) << "key " << k << " lost its committed version " << acked[k];
      EXPECT_LE(v, submitted[k]);
      const auto want = MakeBytes(content_seed(k, v), kSize);
      EXPECT_EQ(std::memcmp(arena_.At<void>(dst.offset), want.data(), kSize), 0)
          << "key " << k << " version " << v << " is not bit-identical";
      acked[k] = v;  // the store committed it, whether or not we heard back
    }
    // Keep one write per key in flight; kill after a random number of completions.
    auto submit = [&](int k) {
      const uint64_t v = ++submitted[k];
      const auto bytes = MakeBytes(content_seed(k, v), kSize);
      std::memcpy(arena_.At<void>(src[k].offset), bytes.data(), kSize);
      ASSERT_TRUE((*p)->Submit(StoreOp::kWrite, (uint64_t(k) << 32) | v,
                               Cmd(key_of(k), v, src[k], kSize), 60000)
                      .ok());
    };
    for (int k = 0; k < kKeys; ++k) submit(k);
    const int kill_after = 10 + static_cast<int>(rng() % 40);
    for (int done = 0; done < kill_after; ++done) {
      auto c = (*p)->NextCompletion(60000);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      ASSERT_TRUE(c->status().ok()) << c->status().ToString();
      const int k = static_cast<int>(c->id >> 32);
      acked[k] = c->id & 0xffffffffu;
      submit(k);
    }
    ASSERT_EQ(::kill((*p)->pid(), SIGKILL), 0);
    const int status = (*p)->Reap();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  }
  // Final check with the offline verifier: every chunk's checksum matches.
  const std::string cmd = std::string(OFFLOADD_STORE_BINARY) +
                          " --verify --log-level=error --dir=" + scratch_.Sub("nvme0") +
                          " --dir=" + scratch_.Sub("nvme1") + ":2 > " + scratch_.Sub("verify.txt");
  EXPECT_EQ(::system(cmd.c_str()), 0);
}

TEST_F(StoreProcessTest, KillNineMidWritesLosesNoCommittedVersion) { KillNineRounds({}); }

TEST_F(StoreProcessTest, KillNineMidWritesOnTheThreadPoolFallback) {
  KillNineRounds({"--io-engine=threads"});
}

}  // namespace
}  // namespace offloadd::storage
