#include "trainer/pipeline/data_parallel.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if defined(OFFLOADD_HAVE_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(OFFLOADD_HAVE_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace offloadd::trainer {

struct DataParallel::State {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  c10::intrusive_ptr<c10d::Backend> side;  // across hosts: SumAcrossHosts's CPU group
  c10::intrusive_ptr<c10d::Backend> gather;  // across hosts: AllGatherBlock's group
  const char* name = "";
  // "rank 0 on hostA (pid 11), rank 1 on hostB (pid 12)": who was in the group, for errors (a
  // collective that fails on a lost peer names only its address).
  std::string members;
  std::vector<std::string> member;  // per rank: "host 1 = hostB (pid 12)" (across hosts)
  int per_host = 0;                 // across hosts: ranks per host (0: one host)
  std::string rendezvous;
  // Across hosts: every rank bumps its heartbeat counter in the store (a store client of its
  // own) every kBeat, so that after a failed collective the ranks whose counters stand still name
  // the lost host (LostHosts).
  c10::intrusive_ptr<c10d::Store> beat_store;
  std::thread beat;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  ~State() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (beat.joinable()) beat.join();
  }
};

namespace {

// "file:///a/b" -> FileStore(/a/b); "tcp://host:port" -> TCPStore (rank 0 serves).
StatusOr<c10::intrusive_ptr<c10d::Store>> MakeStore(const ParallelConfig& c) {
  const auto timeout = std::chrono::milliseconds(c.timeout_seconds * 1000);
  const std::string& r = c.rendezvous;
  if (r.rfind("file://", 0) == 0) {
    const std::string path = r.substr(7);
    if (path.empty() || path[0] != '/') {
      return InvalidArgumentError("rendezvous " + r + ": a file:// rendezvous needs an absolute path");
    }
    auto s = c10::make_intrusive<c10d::FileStore>(path, c.world_size);
    s->setTimeout(timeout);
    return c10::intrusive_ptr<c10d::Store>(s);
  }
  if (r.rfind("tcp://", 0) == 0) {
    const std::string hp = r.substr(6);
    const size_t colon = hp.rfind(':');
    int port = -1;
    if (colon != std::string::npos) {
      char* end = nullptr;
      const long p = std::strtol(hp.c_str() + colon + 1, &end, 10);
      if (end != hp.c_str() + colon + 1 && *end == '\0' && p > 0 && p < 65536) port = static_cast<int>(p);
    }
    if (colon == std::string::npos || colon == 0 || port < 0) {
      return InvalidArgumentError("rendezvous " + r + ": expected tcp://host:port with a port in 1-65535");
    }
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    // Under torchrun its agent serves the store itself (TORCHELASTIC_USE_AGENT_STORE=True): every
    // rank is a client then, as torch.distributed's rendezvous makes them.
    const char* agent = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
    o.isServer = c.rank == 0 && !(agent != nullptr && std::string(agent) == "True");
    o.numWorkers = static_cast<size_t>(c.world_size);
    o.timeout = timeout;
    auto s = c10::make_intrusive<c10d::TCPStore>(hp.substr(0, colon), o);
    return c10::intrusive_ptr<c10d::Store>(s);
  }
  return InvalidArgumentError("rendezvous must be file:///path or tcp://host:port, got '" + r + "'");
}

#if defined(OFFLOADD_HAVE_GLOO)
c10::intrusive_ptr<c10d::Backend> MakeGloo(const c10::intrusive_ptr<c10d::Store>& store,
                                           const ParallelConfig& c,
                                           std::chrono::milliseconds timeout) {
  auto o = c10d::ProcessGroupGloo::Options::create();
  o->timeout = timeout;
  // GLOO_SOCKET_IFNAME picks the interface (as in torch.distributed); else the host name's
  // address, or loopback when it does not resolve.
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  o->devices.push_back(ifname != nullptr && *ifname != '\0'
                           ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                           : c10d::ProcessGroupGloo::createDefaultDevice());
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, c.rank, c.world_size, o);
}
#endif

}  // namespace

namespace {
std::string HostAndPid() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "?");
  return std::string(host) + " (pid " + std::to_string(getpid()) + ")";
}
}  // namespace

StatusOr<std::unique_ptr<DataParallel>> DataParallel::Create(const ParallelConfig& c, c10::Device device) {
  if (c.world_size < 2) return InvalidArgumentError("data parallel needs world_size >= 2");
  if (c.rank < 0 || c.rank >= c.world_size) {
    return InvalidArgumentError("rank " + std::to_string(c.rank) + " outside world_size " +
                                std::to_string(c.world_size));
  }
  if (c.timeout_seconds < 1) return InvalidArgumentError("parallel timeout_seconds must be >= 1");
  std::unique_ptr<DataParallel> dp(new DataParallel());
  dp->rank_ = c.rank;
  dp->world_ = c.world_size;
  dp->state_ = std::make_unique<State>();
  State& st = *dp->state_;
  try {
    ASSIGN_OR_RETURN(st.store, MakeStore(c));
    const auto timeout = std::chrono::milliseconds(c.timeout_seconds * 1000);
    if (device.is_cuda()) {
#if defined(OFFLOADD_HAVE_NCCL)
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = timeout;
      st.backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(st.store, c.rank, c.world_size, o);
      // The rank's GPU, not NCCL's guess (rank modulo the visible GPUs): an executor sees every
      // GPU of the node, and a job placed on GPUs {2, 1} would open its barrier's context on GPU 0.
      st.backend->setBoundDeviceId(device);
      st.name = "nccl";
#else
      return UnimplementedError("this build has no NCCL process group (built without CUDA)");
#endif
    } else {
#if defined(OFFLOADD_HAVE_GLOO)
      st.backend = MakeGloo(st.store, c, timeout);
      st.name = "gloo";
#else
      return UnimplementedError(
          "this build has no Gloo process group (the gloo headers, Debian's libgloo-dev, were missing at "
          "build time), so CPU executors cannot form a data-parallel group");
#endif
    }
    if (c.hosts > 1) {
#if defined(OFFLOADD_HAVE_GLOO)
      // One rank per host (each host's leader, local rank 0) takes the clipping decision.
      st.per_host = c.world_size / c.hosts;
      if (c.rank % st.per_host == 0) {
        ParallelConfig leaders = c;
        leaders.rank = c.rank / st.per_host;
        leaders.world_size = c.hosts;
        st.side = MakeGloo(c10::make_intrusive<c10d::PrefixStore>("offloadd-hosts", st.store),
                           leaders, timeout);
      }
      // Every rank: the gather thread's all-gathers (AllGatherBlock).
      auto gather_store = c10::make_intrusive<c10d::PrefixStore>("offloadd-gather", st.store);
      if (device.is_cuda()) {
#if defined(OFFLOADD_HAVE_NCCL)
        auto o = c10d::ProcessGroupNCCL::Options::create();
        o->timeout = timeout;
        st.gather =
            c10::make_intrusive<c10d::ProcessGroupNCCL>(gather_store, c.rank, c.world_size, o);
        st.gather->setBoundDeviceId(device);
#endif
      } else {
        st.gather = MakeGloo(gather_store, c, timeout);
      }
#else
      return UnimplementedError("parallel.hosts " + std::to_string(c.hosts) +
                                ": the clipping decision across hosts needs a Gloo process group, "
                                "and this build has none (Debian's libgloo-dev was missing)");
#endif
    }
  } catch (const std::exception& e) {
    return UnavailableError("rank " + std::to_string(c.rank) + " joining the data-parallel group at " +
                            c.rendezvous + ": " + e.what());
  }
  RETURN_IF_ERROR(dp->Barrier());  // every rank is in (and the backend's connections are made)
  RETURN_IF_ERROR(dp->Set("member/" + std::to_string(c.rank), HostAndPid()));
  st.rendezvous = c.rendezvous;
  for (int r = 0; r < c.world_size; ++r) {
    ASSIGN_OR_RETURN(const std::string m, dp->Get("member/" + std::to_string(r)));
    const std::string host =
        st.per_host > 0 ? "host " + std::to_string(r / st.per_host) + " = " : "";
    st.member.push_back(host + m);
    st.members += (r == 0 ? "" : ", ") + ("rank " + std::to_string(r) + " on " + host + m);
  }
  if (st.per_host > 0) dp->StartHeartbeat();
  return dp;
}

namespace {
constexpr auto kBeat = std::chrono::milliseconds(250);
std::string BeatKey(int rank) { return "offloadd/heartbeat/" + std::to_string(rank); }
std::string FailedKey(int rank) { return "offloadd/failed/" + std::to_string(rank); }
}  // namespace

void DataParallel::StartHeartbeat() {
  State& st = *state_;
  try {
    st.beat_store = st.store->clone();  // its own connection: never queued behind a get
  } catch (const std::exception&) {
    return;  // a store without clients of its own (FileStore): no names, the errors stay
  }
  st.beat = std::thread([&st, key = BeatKey(rank_)] {
    std::unique_lock<std::mutex> lock(st.mu);
    while (!st.stopping) {
      try {
        st.beat_store->add(key, 1);
      } catch (const std::exception&) {
        return;  // the store's server is gone: LostHosts says so
      }
      st.cv.wait_for(lock, kBeat);
    }
  });
}

// After a failed collective: the ranks whose heartbeat stood still for 8 beats (2 s), by host,
// except those that said they failed themselves (and so may have exited); or the store's server,
// when it cannot be reached.
std::string DataParallel::LostHosts() const {
  State& st = *state_;
  if (!st.beat_store) return "";
  auto read = [&](std::vector<int64_t>* v) {
    for (int r = 0; r < world_; ++r) v->push_back(st.beat_store->add(BeatKey(r), 0));
  };
  std::vector<int64_t> before, after;
  try {
    st.beat_store->set(FailedKey(rank_), std::vector<uint8_t>{1});
    read(&before);
    std::this_thread::sleep_for(kBeat * 8);
    read(&after);
    for (int r = 0; r < world_; ++r) {
      if (after[r] == before[r] && st.beat_store->check({FailedKey(r)})) after[r] = -1;
    }
  } catch (const std::exception& e) {
    return "; the store at " + st.rendezvous + " (served by rank 0, on " + st.member[0] +
           ") cannot be reached: host 0 is lost (" + e.what() + ")";
  }
  std::string lost;
  for (int h = 0; h * st.per_host < world_; ++h) {
    std::string ranks;
    for (int r = h * st.per_host; r < (h + 1) * st.per_host; ++r) {
      if (after[r] == before[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    }
    if (ranks.empty()) continue;
    lost += (lost.empty() ? "" : "; ") + ("host " + std::to_string(h) + " (rank " + ranks +
                                          ", on " + st.member[h * st.per_host] + ")");
  }
  // Rank 0 serves the store (without torchrun's agent): it stays until every other live rank has
  // read the counters too (at most 4 s more), or they would find the store gone.
  try {
    st.beat_store->set("offloadd/read/" + std::to_string(rank_), std::vector<uint8_t>{1});
    const auto until = std::chrono::steady_clock::now() + kBeat * 16;
    for (int r = 1; rank_ == 0 && r < world_; ++r) {
      while (after[r] != before[r] &&
             !st.beat_store->check({"offloadd/read/" + std::to_string(r)}) &&
             std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(kBeat / 5);
      }
    }
  } catch (const std::exception&) {
  }
  return lost.empty() ? "; every rank's heartbeat still moves"
                      : "; lost: " + lost + " stopped answering";
}

DataParallel::~DataParallel() = default;

const char* DataParallel::backend_name() const { return state_->name; }

int64_t DataParallel::Padded(int64_t numel) const { return (numel + world_ - 1) / world_ * world_; }

// Runs a c10d call; its exception becomes UNAVAILABLE naming this rank and the group's hosts.
Status DataParallel::Wrap(const char* what, const std::function<void()>& fn) const {
  try {
    fn();
    return OkStatus();
  } catch (const std::exception& e) {
    // A lost rank surfaces here (its connection closed, or the timeout): name this rank and the
    // group's hosts, since the backend names only the peer's address; across hosts, the lost
    // one by its heartbeat.
    std::string m = std::string("data-parallel ") + what + " on rank " + std::to_string(rank_) +
                    " of " + std::to_string(world_) + ": " + e.what();
    if (!state_->members.empty()) m += " (the group: " + state_->members + ")";
    return UnavailableError(m + LostHosts());
  }
}

Status DataParallel::ReduceScatter(at::Tensor& input, at::Tensor& shard) {
  if (input.numel() != shard.numel() * world_) {
    return InternalError("reduce-scatter of " + std::to_string(input.numel()) + " elements into shards of " +
                         std::to_string(shard.numel()));
  }
  return Wrap("reduce-scatter", [&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    state_->backend->_reduce_scatter_base(shard, input, o)->wait();
  });
}

Status DataParallel::AllReduceSum(at::Tensor& t) {
  return Wrap("all-reduce", [&] {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    state_->backend->allreduce(v, o)->wait();
  });
}

Status DataParallel::AllGather(at::Tensor& shard, at::Tensor& full) {
  if (full.numel() != shard.numel() * world_) {
    return InternalError("all-gather of shards of " + std::to_string(shard.numel()) + " into " +
                         std::to_string(full.numel()) + " elements");
  }
  return Wrap("all-gather", [&] {
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < world_; ++r)
      out[0].push_back(full.narrow(0, r * shard.numel(), shard.numel()));
    std::vector<at::Tensor> in{shard};
    state_->backend->allgather(out, in)->wait();
  });
}

Status DataParallel::AllGatherBlock(at::Tensor& shard, at::Tensor& full) {
  if (!state_->gather) return InternalError("AllGatherBlock in a group within one host");
  if (full.numel() != shard.numel() * world_) {
    return InternalError("all-gather of shards of " + std::to_string(shard.numel()) + " into " +
                         std::to_string(full.numel()) + " elements");
  }
  return Wrap("all-gather of a block's updated slices", [&] {
    if (full.is_cuda()) {  // one flat output, in place when `shard` is this rank's part of it
      state_->gather->_allgather_base(full, shard)->wait();
      return;
    }
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < world_; ++r)
      out[0].push_back(full.narrow(0, r * shard.numel(), shard.numel()));
    std::vector<at::Tensor> in{shard};
    state_->gather->allgather(out, in)->wait();
  });
}

StatusOr<double> DataParallel::SumAcrossHosts(double value) {
  if (!state_->side) return InternalError("SumAcrossHosts in a group within one host");
  at::Tensor t = at::full({1}, value, at::TensorOptions().dtype(at::kDouble));
  RETURN_IF_ERROR(Wrap("all-reduce of the gradient norm across hosts", [&] {
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::SUM;
    state_->side->allreduce(v, o)->wait();
  }));
  return t.item<double>();
}

Status DataParallel::Barrier() {
  return Wrap("barrier", [&] { state_->backend->barrier()->wait(); });
}

Status DataParallel::Set(const std::string& key, const std::string& value) {
  return Wrap("store set", [&] {
    state_->store->set("offloadd/" + key, std::vector<uint8_t>(value.begin(), value.end()));
  });
}

StatusOr<std::string> DataParallel::Get(const std::string& key) {
  std::vector<uint8_t> v;
  RETURN_IF_ERROR(Wrap("store get", [&] { v = state_->store->get("offloadd/" + key); }));
  return std::string(v.begin(), v.end());
}

}  // namespace offloadd::trainer
