#include "trainer/pipeline/arena_population.h"

#include <algorithm>

#include "ipc/shm_segment.h"

namespace offloadd::trainer {
namespace {

constexpr uint64_t kPage = 4096;

// Sorted, disjoint intervals.
using Intervals = std::vector<ByteRange>;

// [r.begin, r.end) less what `covered` holds, in order.
Intervals Subtract(ByteRange r, const Intervals& covered) {
  Intervals out;
  for (const ByteRange& c : covered) {
    if (c.end <= r.begin) continue;
    if (c.begin >= r.end) break;
    if (c.begin > r.begin) out.push_back({r.begin, c.begin});
    r.begin = std::max(r.begin, c.end);
    if (r.begin >= r.end) return out;
  }
  if (r.begin < r.end) out.push_back(r);
  return out;
}

void Insert(Intervals& covered, ByteRange r) {
  auto it = std::lower_bound(covered.begin(), covered.end(), r,
                             [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  covered.insert(it, r);
  Intervals merged;  // adjacent intervals join
  for (const ByteRange& c : covered) {
    if (!merged.empty() && c.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, c.end);
    } else {
      merged.push_back(c);
    }
  }
  covered = std::move(merged);
}

}  // namespace

StatusOr<std::unique_ptr<ArenaPopulation>> ArenaPopulation::Start(ArenaPopulationOptions options) {
  if (options.base == nullptr || reinterpret_cast<uintptr_t>(options.base) % kPage != 0) {
    return InvalidArgumentError("arena population needs a page-aligned mapping");
  }
  if (options.chunk_bytes < kPage) options.chunk_bytes = kPage;
  std::unique_ptr<ArenaPopulation> p(new ArenaPopulation(std::move(options)));
  p->Plan();
  p->start_ = p->end_ = Clock::now();
  const size_t n = std::max<size_t>(
      1, std::min<size_t>(std::max<uint32_t>(1, p->o_.threads), p->chunks_.size()));
  if (p->chunks_.empty()) return p;
  for (size_t t = 0; t < n; ++t) p->threads_.emplace_back([q = p.get()] { q->Run(); });
  return p;
}

void ArenaPopulation::Plan() {
  const uint64_t size = (o_.size + kPage - 1) / kPage * kPage;
  Intervals covered;
  gate_chunks_.assign(o_.gates.size() + 1, 0);
  auto add = [&](size_t gate, ByteRange r) {
    for (uint64_t at = r.begin; at < r.end; at += o_.chunk_bytes) {
      chunks_.push_back({at, std::min(r.end, at + o_.chunk_bytes), gate});
      ++gate_chunks_[gate];
    }
  };
  for (size_t g = 0; g < o_.gates.size(); ++g) {
    for (ByteRange r : o_.gates[g]) {
      r.begin = r.begin / kPage * kPage;
      r.end = std::min(size, (r.end + kPage - 1) / kPage * kPage);
      if (r.begin >= r.end) continue;
      for (const ByteRange& piece : Subtract(r, covered)) add(g, piece);
      Insert(covered, r);
    }
  }
  for (const ByteRange& piece : Subtract({0, size}, covered)) add(o_.gates.size(), piece);
  gate_done_.assign(gate_chunks_.size(), 0);
  gate_time_.assign(gate_chunks_.size(), Clock::time_point{});
}

void ArenaPopulation::Run() {
  for (;;) {
    size_t i;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_ || !error_.ok() || next_ >= chunks_.size()) return;
      i = next_++;
    }
    if (o_.before_chunk) o_.before_chunk(i);
    const Chunk& c = chunks_[i];
    Status st = ipc::PopulatePages(o_.base + c.begin, c.end - c.begin);
    std::lock_guard<std::mutex> lock(mu_);
    // Read under the lock: the times follow the order in which the chunks are counted, so the
    // chunk that completes the population never stamps an end earlier than a gate's.
    const Clock::time_point now = Clock::now();
    if (!st.ok()) {
      if (error_.ok()) error_ = st;
    } else {
      done_bytes_ += c.end - c.begin;
      if (++gate_done_[c.gate] == gate_chunks_[c.gate]) gate_time_[c.gate] = now;
      if (++chunks_done_ == chunks_.size()) end_ = now;
    }
    cv_.notify_all();
  }
}

Status ArenaPopulation::WaitGate(size_t g) {
  if (g >= gate_chunks_.size()) {
    return InvalidArgumentError("arena population has no gate " + std::to_string(g));
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return gate_done_[g] == gate_chunks_[g] || !error_.ok(); });
  if (gate_done_[g] == gate_chunks_[g] && gate_time_[g] == Clock::time_point{}) {
    gate_time_[g] = start_;  // a gate with nothing to populate
  }
  return gate_done_[g] == gate_chunks_[g] ? OkStatus() : error_;
}

Status ArenaPopulation::Finish() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return chunks_done_ == chunks_.size() || !error_.ok(); });
  }
  if (!joined_) {
    for (auto& t : threads_) t.join();
    joined_ = true;
  }
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

ArenaPopulation::~ArenaPopulation() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  if (!joined_) {
    for (auto& t : threads_) t.join();
  }
}

uint64_t ArenaPopulation::populated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_bytes_;
}

ArenaPopulation::Clock::time_point ArenaPopulation::gate_time(size_t g) const {
  std::lock_guard<std::mutex> lock(mu_);
  return g < gate_time_.size() ? gate_time_[g] : Clock::time_point{};
}

}  // namespace offloadd::trainer
