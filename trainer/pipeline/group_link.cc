#include "trainer/pipeline/group_link.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "ipc/unique_fd.h"

namespace offloadd::trainer {
namespace {

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "the control segment's counters are shared between processes");
static_assert(std::is_trivially_copyable_v<workers::StepResult>);

constexpr size_t kSlots = 8;  // steps a follower may lag behind: the collectives keep it at 2

// A shared (not private) futex: the ranks are separate processes.
void FutexWait(std::atomic<uint32_t>* word, uint32_t seen, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}
void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace

struct GroupLink::Control {
  uint32_t world = 0;
  uint32_t blocks = 0;
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> aborted{0};
  std::atomic<uint64_t> initialized{0};
  std::atomic<uint64_t> boundary{0};  // (completed + 1) << 1 | stop
  char error[1024] = {};
};

struct GroupLink::StepSlot {
  std::atomic<uint64_t> step{0};  // 0 while being written
  uint32_t ok = 0;
  char error[512] = {};
  workers::StepResult result;
};

namespace {
struct Layout {
  size_t slots, info, consumed, updated, arrived, sq, total;
};
Layout LayoutFor(size_t world, size_t blocks, size_t control, size_t slot) {
  auto up = [](size_t v) { return (v + 63) / 64 * 64; };
  Layout l{};
  l.slots = up(control);
  l.info = up(l.slots + 2 * kSlots * slot);
  l.consumed = up(l.info + blocks * sizeof(GroupLink::BlockInfo));
  l.updated = up(l.consumed + blocks * 8);
  l.arrived = up(l.updated + blocks * 8);
  l.sq = up(l.arrived + world * blocks * 8);
  l.total = up(l.sq + world * blocks * 8);
  return l;
}
}  // namespace

GroupLink::GroupLink(ipc::SharedSegment segment, int rank, double timeout_seconds)
    : segment_(std::move(segment)), rank_(rank), timeout_seconds_(timeout_seconds) {}

StatusOr<std::unique_ptr<GroupLink>> GroupLink::Create(int world, int blocks, double timeout_seconds) {
  if (world < 2 || world > kMaxWorld) {
    return InvalidArgumentError("a data-parallel group has 2 to " + std::to_string(kMaxWorld) +
                                " ranks, not " + std::to_string(world));
  }
  if (blocks <= 0) return InvalidArgumentError("a data-parallel group needs a model with blocks");
  const Layout l = LayoutFor(world, blocks, sizeof(Control), sizeof(StepSlot));
  ipc::SegmentOptions so;
  so.name = "offloadd-group";
  ASSIGN_OR_RETURN(ipc::SharedSegment seg, ipc::SharedSegment::Create(l.total, so));
  std::memset(seg.data(), 0, l.total);
  auto* c = new (seg.data()) Control();
  c->world = static_cast<uint32_t>(world);
  c->blocks = static_cast<uint32_t>(blocks);
  for (size_t i = 0; i < 2 * kSlots; ++i) new (seg.data() + l.slots + i * sizeof(StepSlot)) StepSlot();
  return std::unique_ptr<GroupLink>(new GroupLink(std::move(seg), 0, timeout_seconds));
}

StatusOr<std::unique_ptr<GroupLink>> GroupLink::Attach(const std::string& path, int rank,
                                                       double timeout_seconds) {
  ipc::UniqueFd fd(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) {
    return UnavailableError("rank " + std::to_string(rank) + " cannot open the group's control segment " +
                            path + ": " + std::strerror(errno) +
                            " (the ranks of a job must run on one host, as one user)");
  }
  ASSIGN_OR_RETURN(ipc::SharedSegment seg, ipc::SharedSegment::Attach(fd.get()));
  if (seg.data_size() < sizeof(Control)) return InvalidArgumentError("control segment too small: " + path);
  const auto* c = reinterpret_cast<const Control*>(seg.data());
  const Layout l = LayoutFor(c->world, c->blocks, sizeof(Control), sizeof(StepSlot));
  if (seg.data_size() < l.total) return InvalidArgumentError("control segment truncated: " + path);
  if (rank <= 0 || rank >= static_cast<int>(c->world)) {
    return InvalidArgumentError("rank " + std::to_string(rank) + " outside the group of " +
                                std::to_string(c->world));
  }
  return std::unique_ptr<GroupLink>(new GroupLink(std::move(seg), rank, timeout_seconds));
}

std::string GroupLink::Path() const {
  return "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(segment_.fd());
}

GroupLink::Control* GroupLink::control() const { return reinterpret_cast<Control*>(segment_.data()); }
int GroupLink::world() const { return static_cast<int>(control()->world); }
int GroupLink::blocks() const { return static_cast<int>(control()->blocks); }

GroupLink::StepSlot* GroupLink::slot(bool finished, uint64_t step) const {
  const Layout l = LayoutFor(world(), blocks(), sizeof(Control), sizeof(StepSlot));
  const size_t i = (finished ? kSlots : 0) + step % kSlots;
  return reinterpret_cast<StepSlot*>(segment_.data() + l.slots + i * sizeof(StepSlot));
}
GroupLink::BlockInfo* GroupLink::info_at(int b) const {
  const Layout l = LayoutFor(world(), blocks(), sizeof(Control), sizeof(StepSlot));
  return reinterpret_cast<BlockInfo*>(segment_.data() + l.info) + b;
}
std::atomic<uint64_t>* GroupLink::consumed_at(int b) const {
  const Layout l = LayoutFor(world(), blocks(), sizeof(Control), sizeof(StepSlot));
  return reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + l.consumed) + b;
}
std::atomic<uint64_t>* GroupLink::updated_at(int b) const {
  const Layout l = LayoutFor(world(), blocks(), sizeof(Control), sizeof(StepSlot));
  return reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + l.updated) + b;
}
std::atomic<uint64_t>* GroupLink::arrived_at(int rank, int b) const {
  const Layout l = LayoutFor(world(), blocks(), sizeof(Control), sizeof(StepSlot));
  return reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + l.arrived) +
         static_cast<size_t>(rank) * blocks() + b;
}
std::atomic<uint64_t>* GroupLink::sq_at(int rank, int b) const {
  const Layout l = LayoutFor(world(), blocks(), sizeof(Control), sizeof(StepSlot));
  return reinterpret_cast<std::atomic<uint64_t>*>(segment_.data() + l.sq) +
         static_cast<size_t>(rank) * blocks() + b;
}

void GroupLink::Bump() {
  control()->seq.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&control()->seq);
}
uint32_t GroupLink::sequence() const { return control()->seq.load(std::memory_order_acquire); }
void GroupLink::SleepWhile(uint32_t seen, int timeout_ms) const {
  FutexWait(&control()->seq, seen, timeout_ms);
}

void GroupLink::SetBlock(int b, const BlockInfo& info) { *info_at(b) = info; }
GroupLink::BlockInfo GroupLink::block(int b) const { return *info_at(b); }

void GroupLink::PublishInitialized(uint64_t generation) {
  control()->initialized.store(generation, std::memory_order_release);
  Bump();
}
void GroupLink::PublishConsumed(int b, uint64_t handoffs) {
  consumed_at(b)->store(handoffs, std::memory_order_release);
  Bump();
}
void GroupLink::PublishUpdated(int b, uint64_t step) {
  updated_at(b)->store(step, std::memory_order_release);
  Bump();
}
uint64_t GroupLink::consumed(int b) const { return consumed_at(b)->load(std::memory_order_acquire); }
uint64_t GroupLink::updated(int b) const { return updated_at(b)->load(std::memory_order_acquire); }

void GroupLink::PublishArrived(int b, uint64_t handoffs, double sq_norm) {
  uint64_t bits;
  std::memcpy(&bits, &sq_norm, sizeof(bits));
  sq_at(rank_, b)->store(bits, std::memory_order_relaxed);
  arrived_at(rank_, b)->store(handoffs, std::memory_order_release);
  Bump();
}

bool GroupLink::PeersArrived(int b, uint64_t handoffs) const {
  for (int r = 1; r < world(); ++r) {
    if (arrived_at(r, b)->load(std::memory_order_acquire) < handoffs) return false;
  }
  return true;
}

double GroupLink::PeersSquaredNorm(int b) const {
  double sum = 0;
  for (int r = 1; r < world(); ++r) {
    const uint64_t bits = sq_at(r, b)->load(std::memory_order_relaxed);
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    sum += v;
  }
  return sum;
}

namespace {
void WriteSlot(std::atomic<uint64_t>& tag, uint32_t* ok, char* error, size_t error_size,
               workers::StepResult* result, uint64_t step, const StatusOr<workers::StepResult>& r) {
  tag.store(0, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_release);
  *ok = r.ok() ? 1 : 0;
  std::memset(error, 0, error_size);
  if (r.ok()) {
    *result = *r;
  } else {
    const std::string m = r.status().ToString();
    std::memcpy(error, m.data(), std::min(m.size(), error_size - 1));
  }
  tag.store(step, std::memory_order_release);
}
}  // namespace

void GroupLink::PublishDecision(uint64_t step, const workers::StepResult& r) {
  StepSlot* s = slot(false, step);
  WriteSlot(s->step, &s->ok, s->error, sizeof(s->error), &s->result, step, r);
  Bump();
}
void GroupLink::PublishFinished(uint64_t step, const StatusOr<workers::StepResult>& r) {
  StepSlot* s = slot(true, step);
  WriteSlot(s->step, &s->ok, s->error, sizeof(s->error), &s->result, step, r);
  Bump();
}

void GroupLink::Abort(const Status& why) {
  Control* c = control();
  uint32_t expected = 0;
  if (c->aborted.load() == 0) {
    const std::string m = "rank " + std::to_string(rank_) + ": " + why.ToString();
    std::memset(c->error, 0, sizeof(c->error));
    std::memcpy(c->error, m.data(), std::min(m.size(), sizeof(c->error) - 1));
    c->aborted.compare_exchange_strong(expected, 1, std::memory_order_acq_rel);
  }
  Bump();
}

Status GroupLink::aborted() const {
  const Control* c = control();
  if (c->aborted.load(std::memory_order_acquire) == 0) return OkStatus();
  return AbortedError("the data-parallel group stopped: " + std::string(c->error, strnlen(c->error, sizeof(c->error))));
}

Status GroupLink::Wait(const std::function<bool()>& pred, const std::string& what) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds_);
  for (;;) {
    const uint32_t seen = sequence();
    if (pred()) return OkStatus();
    RETURN_IF_ERROR(aborted());
    if (std::chrono::steady_clock::now() > deadline) {
      return Status(StatusCode::kDeadlineExceeded, "rank " + std::to_string(rank_) + " waited " +
                                   std::to_string(static_cast<int64_t>(timeout_seconds_)) + " s for " +
                                   what + " (parallel.timeout_seconds)");
    }
    SleepWhile(seen, 100);
  }
}

StatusOr<workers::StepResult> GroupLink::WaitSlot(bool finished, uint64_t step) const {
  StepSlot* s = slot(finished, step);
  for (;;) {
    RETURN_IF_ERROR(Wait([&] { return s->step.load(std::memory_order_acquire) == step; },
                         std::string(finished ? "the result" : "the decision") + " of step " +
                             std::to_string(step)));
    const uint32_t ok = s->ok;
    const workers::StepResult r = s->result;
    const std::string error(s->error, strnlen(s->error, sizeof(s->error)));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s->step.load(std::memory_order_acquire) != step) continue;  // rewritten meanwhile
    if (ok == 0) return InternalError("rank 0, step " + std::to_string(step) + ": " + error);
    return r;
  }
}

StatusOr<workers::StepResult> GroupLink::WaitDecision(uint64_t step) const { return WaitSlot(false, step); }
StatusOr<workers::StepResult> GroupLink::WaitFinished(uint64_t step) const { return WaitSlot(true, step); }

Status GroupLink::WaitInitialized(uint64_t generation) const {
  return Wait([&] { return control()->initialized.load(std::memory_order_acquire) >= generation; },
              "rank 0's weights in the arena");
}

void GroupLink::PublishBoundary(int64_t completed, bool stop) {
  control()->boundary.store((static_cast<uint64_t>(completed + 1) << 1) | (stop ? 1 : 0), std::memory_order_release);
  Bump();
}

StatusOr<bool> GroupLink::WaitBoundary(int64_t completed) const {
  const uint64_t want = static_cast<uint64_t>(completed + 1);
  uint64_t v = 0;
  RETURN_IF_ERROR(Wait(
      [&] {
        v = control()->boundary.load(std::memory_order_acquire);
        return (v >> 1) >= want;
      },
      "rank 0 at the end of step " + std::to_string(completed)));
  return (v >> 1) == want && (v & 1) != 0;
}

}  // namespace offloadd::trainer
