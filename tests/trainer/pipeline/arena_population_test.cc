// The arena populated in the background: gates complete in order and a done
// gate may be written while later ones are populated; populating never changes contents; and a
// HostOptimizer filling its masters beside the population ends with the same arena, bit for bit,
// as one that populated everything first, while the fill ran before the population ended.
#include "trainer/pipeline/arena_population.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "trainer/pipeline/host_optimizer.h"
#include "workers/adamw_compact.h"
#include "workers/adamw_kernel_impl.h"

namespace offloadd::trainer {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kPage = 4096;

std::string BinaryDir() {
  if (const char* dir = std::getenv("OFFLOADD_BINARY_DIR")) return dir;
  char exe[4096];  // <build>/tests/trainer/arena_population_test -> <build>
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string path(exe, n > 0 ? static_cast<size_t>(n) : 0);
  return path.substr(0, path.rfind('/')) + "/../..";
}

// A shared anonymous mapping, unpopulated.
struct Mapping {
  explicit Mapping(size_t bytes) : size(bytes) {
    base = static_cast<uint8_t*>(
        ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  }
  ~Mapping() {
    if (base != MAP_FAILED) ::munmap(base, size);
  }
  uint8_t* base;
  size_t size;
};

// Resident pages of [p, p + bytes) (mincore).
size_t Resident(const uint8_t* p, size_t bytes) {
  std::vector<unsigned char> v(bytes / kPage);
  if (::mincore(const_cast<uint8_t*>(p), bytes, v.data()) != 0) return 0;
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

// Blocks the population's chunks from index `from` on until Release() (or 20 s: a deadlock
// fails the test instead of hanging it, and timed_out() says so).
class Gatekeeper {
 public:
  explicit Gatekeeper(size_t from) : from_(from) {}
  void BeforeChunk(size_t chunk) {
    if (chunk < from_) return;
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(20), [&] { return released_; })) timed_out_ = true;
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  bool timed_out() {
    std::lock_guard<std::mutex> lock(mu_);
    return timed_out_;
  }

 private:
  size_t from_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false, timed_out_ = false;
};

TEST(ArenaPopulationTest, GatesCompleteInOrderAndTheRestFollows) {
  Mapping m(64 * kPage);
  ASSERT_NE(m.base, MAP_FAILED);
  ArenaPopulationOptions o;
  o.base = m.base;
  o.size = m.size;
  o.threads = 3;
  o.chunk_bytes = 2 * kPage;
  // Gate 0: pages 40-43 and 10-11; gate 1: pages 20-23 (with a range overlapping gate 0's).
  o.gates = {{{40 * kPage, 44 * kPage}, {10 * kPage + 100, 11 * kPage + 7}},
             {{20 * kPage, 24 * kPage}, {41 * kPage, 42 * kPage}}};
  Gatekeeper keeper(3);  // gate 0 is chunks 0-2 and gate 1 chunks 3-4 (its second range is gate 0's)
  o.before_chunk = [&](size_t c) { keeper.BeforeChunk(c); };
  auto p = ArenaPopulation::Start(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_EQ((*p)->num_gates(), 2u);
  ASSERT_TRUE((*p)->WaitGate(0).ok());
  EXPECT_EQ(Resident(m.base + 40 * kPage, 4 * kPage), 4u);
  EXPECT_EQ(Resident(m.base + 10 * kPage, 2 * kPage), 2u);
  // Gate 0's pages may be written while the population is held behind it.
  std::memset(m.base + 40 * kPage, 0x5a, 4 * kPage);
  EXPECT_LT((*p)->populated_bytes(), m.size);
  keeper.Release();
  EXPECT_FALSE(keeper.timed_out());
  ASSERT_TRUE((*p)->WaitGate(1).ok());
  ASSERT_TRUE((*p)->Finish().ok());
  EXPECT_EQ((*p)->populated_bytes(), m.size);  // every page once
  EXPECT_EQ((*p)->num_chunks(), 3u + 2u + 27u);  // the rest: 54 pages in chunks of 2
  EXPECT_EQ(Resident(m.base, m.size), 64u);
  for (size_t i = 0; i < 4 * kPage; ++i) ASSERT_EQ(m.base[40 * kPage + i], 0x5a) << i;
  EXPECT_LE((*p)->gate_time(0), (*p)->gate_time(1));
  EXPECT_LE((*p)->gate_time(1), (*p)->end_time());
}

TEST(ArenaPopulationTest, PopulatingKeepsWhatWasWritten) {
  Mapping m(16 * kPage);
  ASSERT_NE(m.base, MAP_FAILED);
  for (size_t i = 0; i < m.size; i += 997) m.base[i] = static_cast<uint8_t>(i / 997 + 1);
  ArenaPopulationOptions o;
  o.base = m.base;
  o.size = m.size;
  o.threads = 4;
  o.chunk_bytes = kPage;
  o.gates = {{{3 * kPage, 9 * kPage}}};
  auto p = ArenaPopulation::Start(o);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->Finish().ok());
  for (size_t i = 0; i < m.size; ++i) {
    ASSERT_EQ(m.base[i], i % 997 == 0 ? static_cast<uint8_t>(i / 997 + 1) : 0) << i;
  }
}

HostOptimizerOptions Options(bool background) {
  HostOptimizerOptions o;
  o.block_elements = {30000, 50000, 20000, 70000};
  o.compute = HostDtype::kBf16;
  o.worker_binary = BinaryDir() + "/workers/offloadd-worker";
  o.populate_threads = 3;
  o.populate_in_background = background;
  return o;
}

// Deterministic, distinct initial values (the bf16 copy rounds them).
float Initial(int block, uint64_t i) {
  return static_cast<float>((i * 2654435761u + static_cast<uint64_t>(block) * 97) % 100003) * 1e-5f -
         0.5f;
}

// Fills every block's masters in pieces of at most 7,000 elements on 3 threads; the time the last
// piece was written.
Clock::time_point Fill(HostOptimizer* h) {
  std::vector<HostOptimizer::InitPiece> pieces;
  for (int b = 0; b < h->num_blocks(); ++b) {
    for (uint64_t at = 0; at < h->elements(b); at += 7000) {
      pieces.push_back({b, at, std::min<uint64_t>(7000, h->elements(b) - at)});
    }
  }
  std::mutex mu;
  Clock::time_point last{};
  Status st = h->InitializePieces(
      pieces,
      [&](const HostOptimizer::InitPiece& p, float* dst) {
        for (uint64_t i = 0; i < p.count; ++i) dst[i] = Initial(p.block, p.begin + i);
        std::lock_guard<std::mutex> lock(mu);
        last = std::max(last, Clock::now());
        return OkStatus();
      },
      3);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return last;
}

TEST(HostOptimizerPopulationTest, MastersFilledBesideThePopulationEqualTheSerialOnes) {
  // Serial: the whole arena populated at creation, then filled.
  auto serial = HostOptimizer::Create(Options(false));
  ASSERT_TRUE(serial.ok()) << serial.status().ToString();
  EXPECT_FALSE((*serial)->populating_in_background());
  Fill(serial->get());
  ASSERT_TRUE((*serial)->WaitPopulated().ok());

  // Background: the population is held after the blocks' gates (two ranges each, one chunk each)
  // until every master is filled; a fill that waited for the whole arena would hold it 20 s.
  HostOptimizerOptions o = Options(true);
  Gatekeeper keeper(2 * o.block_elements.size());
  o.populate_hook = [&](size_t c) { keeper.BeforeChunk(c); };
  auto overlapped = HostOptimizer::Create(o);
  ASSERT_TRUE(overlapped.ok()) << overlapped.status().ToString();
  HostOptimizer& h = **overlapped;
  EXPECT_TRUE(h.populating_in_background());
  const Clock::time_point filled = Fill(&h);
  keeper.Release();
  ASSERT_TRUE(h.WaitPopulated().ok());
  EXPECT_FALSE(h.populating_in_background());
  // The phases overlapped: the workers started and every master was written before the last
  // page of the arena was populated.
  EXPECT_LT(h.workers_end(), h.arena_end());
  EXPECT_LT(filled, h.arena_end());
  EXPECT_FALSE(keeper.timed_out()) << "the fill waited for the population the test held";
  EXPECT_GT(h.arena_seconds(), 0.0);

  for (int b = 0; b < h.num_blocks(); ++b) {
    const uint64_t n = h.elements(b);
    ASSERT_EQ(std::memcmp(h.master_weights(b), (*serial)->master_weights(b), n * 4), 0) << b;
    ASSERT_EQ(std::memcmp(h.compute_weights(b), (*serial)->compute_weights(b), n * 2), 0) << b;
    std::vector<float> m1(n), v1(n), w1(n), m2(n), v2(n), w2(n);
    ASSERT_TRUE(h.ReadStates(b, w1.data(), m1.data(), v1.data()).ok());
    ASSERT_TRUE((*serial)->ReadStates(b, w2.data(), m2.data(), v2.data()).ok());
    EXPECT_EQ(std::memcmp(m1.data(), m2.data(), n * 4), 0) << b;  // the moments start at zero
    EXPECT_EQ(std::memcmp(v1.data(), v2.data(), n * 4), 0) << b;
    EXPECT_EQ(w1[n / 2], Initial(b, n / 2));
  }
}

}  // namespace
// A bf16 master is filled in pieces through fp32 scratch and rounded into its region (the bf16
// master, then its compensation): in the background as serially, to the same bytes; the device's
// weights are the masters rounded to nearest, and they read back as the initial values to 17 bits.
TEST(HostOptimizerPopulationTest, ABf16MasterIsFilledInPiecesBesideThePopulation) {
  std::unique_ptr<HostOptimizer> hs[2];
  for (const bool background : {false, true}) {
    HostOptimizerOptions o = Options(background);
    o.mode = {workers::StateDtype::kFp32, workers::MasterDtype::kBf16};
    auto h = HostOptimizer::Create(o);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    Fill(h->get());
    ASSERT_TRUE((*h)->WaitPopulated().ok());
    hs[background] = std::move(*h);
  }
  for (int b = 0; b < hs[0]->num_blocks(); ++b) {
    const uint64_t n = hs[0]->elements(b);
    std::vector<uint8_t> r0(hs[0]->master_region_bytes(b)), r1(r0.size());
    ASSERT_TRUE(hs[0]->ReadMasterRegion(b, r0.data()).ok());
    ASSERT_TRUE(hs[1]->ReadMasterRegion(b, r1.data()).ok());
    ASSERT_EQ(r0, r1) << b;
    const auto* w = static_cast<const uint16_t*>(hs[1]->compute_weights(b));
    std::vector<float> master(n);
    ASSERT_TRUE(hs[1]->ReadStates(b, master.data(), nullptr, nullptr).ok());
    for (uint64_t i = 0; i < n; ++i) {
      const float p = Initial(b, i);
      ASSERT_EQ(w[i], workers::internal::FloatToBf16(p)) << b << " " << i;
      ASSERT_LE(std::fabs(master[i] - p), std::ldexp(std::fabs(p), -16)) << b << " " << i;
    }
  }
}

}  // namespace offloadd::trainer
