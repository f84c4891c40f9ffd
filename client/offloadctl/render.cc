#include "client/offloadctl/render.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "common/units.h"

namespace offloadctl {

std::string JobStateName(offloadd::v1::JobState s) {
  std::string n = offloadd::v1::JobState_Name(s);
  const std::string prefix = "JOB_STATE_";
  if (n.rfind(prefix, 0) == 0) n = n.substr(prefix.size());
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return n;
}

namespace {

std::string Bytes(uint64_t b) { return offloadd::FormatByteSize(b); }

}  // namespace

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

namespace {
std::string FormatTime(int64_t unix_seconds) {
  const std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}
}  // namespace

std::string RenderNodeInfo(const offloadd::v1::NodeInfo& n) {
  std::ostringstream o;
  o << "host        " << n.hostname() << " (Linux " << n.kernel_release() << ")\n";
  o << "offloadd    " << n.build().version() << " " << n.build().git_revision() << ", "
    << (n.build().cuda() ? "CUDA" : "CPU") << " flavour, LibTorch " << n.build().torch_version() << "\n";
  // Why health is NOT_SERVING (jobs not durable: jobs.db missing, the state directory failing).
  if (!n.serving_problem().empty()) o << "health      NOT_SERVING: " << n.serving_problem() << "\n";
  o << "cpu         " << n.cpu().model_name() << ": " << n.cpu().physical_cores() << " cores / "
    << n.cpu().logical_cores() << " threads" << (n.cpu().avx512f() ? ", AVX-512" : "")
    << (n.cpu().avx512_bf16() ? " (BF16)" : "") << (n.cpu().avx2() ? ", AVX2" : "") << "\n";
  o << "adamw       " << (n.cpu().adamw_kernel().empty() ? "?" : n.cpu().adamw_kernel()) << " kernel ("
    << n.cpu().adamw_kernel_reason() << "); supported:";
  for (const auto& k : n.cpu().adamw_kernels()) o << " " << k;
  o << "\n";
  const auto& m = n.memory();
  o << "memory      " << Bytes(m.total_bytes()) << " total, " << Bytes(m.available_bytes()) << " available, "
    << "/dev/shm " << Bytes(m.shm_available_bytes()) << " free, memlock "
    << (m.memlock_limit_bytes() == 0 ? std::string("unlimited") : Bytes(m.memlock_limit_bytes())) << "\n";
  if (m.hugepages_total() > 0) {
    o << "hugepages   " << m.hugepages_free() << "/" << m.hugepages_total() << " free of "
      << Bytes(m.hugepage_size_bytes()) << "\n";
  }
  for (const auto& node : n.numa_nodes()) {
    o << "numa " << node.id() << "      cpus " << node.cpus() << ", " << Bytes(node.memory_total_bytes()) << "\n";
  }
  if (n.gpus().empty()) o << "gpus        none: " << n.gpu_problem() << "\n";
  for (const auto& g : n.gpus()) {
    o << "gpu " << g.index() << "       " << g.name() << ", " << Bytes(g.total_memory_bytes()) << " ("
      << Bytes(g.free_memory_bytes()) << " free), sm_" << g.compute_capability_major()
      << g.compute_capability_minor() << ", " << g.pci_bus_id() << ", NUMA node "
      << (g.numa_node() >= 0 ? std::to_string(g.numa_node()) : std::string("unknown"))
      << (g.job_id().empty() ? std::string(", free") : ", running " + g.job_id()) << "\n";
  }
  for (const auto& s : n.store_directories()) {
    o << "store       " << s.path() << " weight " << s.weight() << ": " << Bytes(s.available_bytes()) << " free of "
      << Bytes(s.capacity_bytes()) << (s.problem().empty() ? "" : " — " + s.problem()) << "\n";
  }
  o << "io_uring    " << (n.io_uring_available() ? "available" : "unavailable: " + n.io_uring_problem()) << "\n";
  const auto& b = n.bandwidths();
  if (b.host_memory_bytes_per_second() > 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "profile     host memory %.1f GB/s, AdamW %.2f G params/s (%d threads, %s), "
                  "PCIe H2D %.1f / D2H %.1f / both %.1f GB/s, measured %s\n",
                  b.host_memory_bytes_per_second() / 1e9, b.adamw_params_per_second() / 1e9,
                  b.adamw_threads(), b.adamw_kernel().c_str(), b.host_to_device_bytes_per_second() / 1e9,
                  b.device_to_host_bytes_per_second() / 1e9, b.both_directions_bytes_per_second() / 1e9,
                  b.has_measured_at() ? FormatTime(b.measured_at().seconds()).c_str() : "?");
    o << buf;
    if (b.adamw_by_threads_size() > 0) {
      o << "            AdamW by threads:";
      for (const auto& r : b.adamw_by_threads()) {
        std::snprintf(buf, sizeof(buf), " %d: %.2f", r.threads(), r.params_per_second() / 1e9);
        o << buf;
      }
      o << " G params/s";
      if (b.adamw_params_per_second_during_dma() > 0) {
        std::snprintf(buf, sizeof(buf), "; %.2f while both PCIe directions copy",
                      b.adamw_params_per_second_during_dma() / 1e9);
        o << buf;
      }
      o << "\n";
    }
    if (!b.store_directory().empty()) {
      std::snprintf(buf, sizeof(buf), "            store %s: write %.2f / read %.2f GB/s%s\n",
                    b.store_directory().c_str(), b.store_write_bytes_per_second() / 1e9,
                    b.store_read_bytes_per_second() / 1e9, b.store_direct_io() ? " (O_DIRECT)" : " (buffered)");
      o << buf;
    }
  } else if (!b.problem().empty()) {
    o << "profile     " << b.problem() << "\n";
  }
  for (const auto& p : n.shape_profiles()) {
    double fwd = 0, bwd = 0;
    int64_t keep = 0, transient = 0;
    for (const auto& blk : p.blocks()) {
      fwd += blk.forward_seconds();
      bwd += blk.backward_seconds();
      keep += blk.keep_bytes();
      transient = std::max<int64_t>(transient, blk.backward_transient_bytes());
    }
    char buf[640];
    std::snprintf(buf, sizeof(buf),
                  "shape       %s\n            %d blocks: forward %.1f ms, backward %.1f ms per micro-batch; "
                  "activations %s if all kept; largest backward transient %s; peak %s, working set %s; "
                  "measured %s\n",
                  p.key().c_str(), p.blocks_size(), 1e3 * fwd, 1e3 * bwd,
                  Bytes(static_cast<uint64_t>(keep)).c_str(), Bytes(static_cast<uint64_t>(transient)).c_str(),
                  Bytes(static_cast<uint64_t>(p.peak_reserved_bytes())).c_str(),
                  Bytes(static_cast<uint64_t>(p.workspace_bytes())).c_str(),
                  p.has_measured_at() ? FormatTime(p.measured_at().seconds()).c_str() : "?");
    o << buf;
  }
  for (const auto& problem : n.shape_profile_problems()) o << "shape       unreadable: " << problem << "\n";
  return o.str();
}

std::string RenderJob(const offloadd::v1::Job& j) {
  std::ostringstream o;
  o << "job " << j.id() << "  " << JobStateName(j.state());
  if (!j.spec().display_name().empty()) o << "  \"" << j.spec().display_name() << "\"";
  o << "\n";
  if (!j.submitted_by().empty()) o << "  submitted by " << j.submitted_by() << "\n";
  const auto& p = j.progress();
  if (p.step() > 0) {
    o << "  step " << p.step() << "/" << p.max_steps() << "  loss " << p.loss() << "  lr " << p.learning_rate()
      << "  " << p.tokens_per_second() << " tok/s\n";
  }
  if (j.has_error() && j.error().code() != 0) {
    o << "  error: " << j.error().message();
    if (!j.error().field_path().empty()) o << " (" << j.error().field_path() << ")";
    o << "\n";
  }
  return o.str();
}

std::string RenderJobList(const offloadd::v1::ListJobsResponse& r) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%-24s %-11s %10s %10s  %s\n", "JOB", "STATE", "STEP", "LOSS", "NAME");
  o << line;
  for (const auto& j : r.jobs()) {
    std::snprintf(line, sizeof line, "%-24s %-11s %10lld %10.4f  %s\n", j.id().c_str(), JobStateName(j.state()).c_str(),
                  static_cast<long long>(j.progress().step()), j.progress().loss(), j.spec().display_name().c_str());
    o << line;
  }
  if (!r.next_page_token().empty()) o << "(more: next page token " << r.next_page_token() << ")\n";
  return o.str();
}

std::string RenderProgressLine(const offloadd::v1::JobProgress& p, int bar_width) {
  std::ostringstream o;
  o << "step " << p.step();
  if (p.max_steps() > 0) {
    const double frac = std::min(1.0, static_cast<double>(p.step()) / static_cast<double>(p.max_steps()));
    const int filled = static_cast<int>(frac * bar_width + 1e-9);
    o << "/" << p.max_steps() << " [" << std::string(filled, '#') << std::string(bar_width - filled, '.') << "] ";
    char pct[8];
    std::snprintf(pct, sizeof pct, "%3d%%", static_cast<int>(frac * 100 + 1e-9));
    o << pct;
  }
  char buf[160];
  std::snprintf(buf, sizeof buf, "  loss %.4f  lr %.1e  %.0f tok/s", p.loss(), p.learning_rate(), p.tokens_per_second());
  o << buf;
  if (p.has_eta()) {
    const int64_t s = p.eta().seconds();
    std::snprintf(buf, sizeof buf, "  ETA %lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
    o << buf;
  }
  return o.str();
}

std::string RenderEvent(const offloadd::v1::JobEvent& e) {
  std::ostringstream o;
  o << "[" << e.cursor() << "] ";
  if (e.has_state_change()) o << "state " << JobStateName(e.state_change().state()) << " " << e.state_change().reason();
  else if (e.has_progress()) o << RenderProgressLine(e.progress());
  else if (e.has_log()) o << e.log().message();
  else if (e.has_checkpoint_saved()) o << "checkpoint " << e.checkpoint_saved().id() << " at step " << e.checkpoint_saved().step();
  o << "\n";
  return o.str();
}

}  // namespace offloadctl
