#include "client/offloadctl/render.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <sstream>

#include "common/message_text.h"
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

namespace {

// Whether the code point is one a terminal must not receive raw: C1 controls (U+0080-U+009F; 0x9b
// is CSI on terminals that read 8-bit controls) and the bidirectional controls that reorder what
// follows (Trojan Source: U+061C, U+200E/F, U+202A-U+202E, U+2066-U+2069).
bool IsHiddenControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x61c || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

uint32_t CodePoint(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k])); };
  if (n == 2) return ((b(0) & 0x1f) << 6) | (b(1) & 0x3f);
  if (n == 3) return ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f);
}

std::string Escape(std::string_view s, bool keep_newlines) {
  std::string out;
  out.reserve(s.size());
  char buf[16];
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<uint8_t>(s[i]);
    const size_t n = offloadd::Utf8SequenceLength(s, i);
    if (n == 1 && c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else if (n == 1 && c == '\n') {
      out += keep_newlines ? "\n" : "\\n";
    } else if (n == 1 && c == '\t') {
      out += "\\t";
    } else if (n == 0 || n == 1) {  // invalid UTF-8, or a C0 control or DEL
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else if (const uint32_t cp = CodePoint(s, i, n); IsHiddenControl(cp)) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(s.substr(i, n));
    }
    i += n == 0 ? 1 : n;
  }
  return out;
}

}  // namespace

std::string TerminalText(std::string_view s) { return Escape(s, /*keep_newlines=*/false); }
std::string TerminalLines(std::string_view s) { return Escape(s, /*keep_newlines=*/true); }

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
  o << "memory      " << Bytes(m.total_bytes()) << " total, " << Bytes(m.available_bytes())
    << " available, "
    << "/dev/shm " << Bytes(m.shm_available_bytes()) << " free, memlock "
    << (m.memlock_limit_bytes() == 0 ? std::string("unlimited") : Bytes(m.memlock_limit_bytes()))
    << (m.cgroup_memory_max_bytes() > 0 ? ", cgroup " + Bytes(m.cgroup_memory_current_bytes()) +
                                              " used of " + Bytes(m.cgroup_memory_max_bytes())
                                        : std::string())
    << "\n";
  if (m.default_host_memory_limit_bytes() > 0) {
    o << "host limit  " << Bytes(m.default_host_memory_limit_bytes()) << " per job by default ("
      << m.default_host_memory_limit_source() << "; resources.host_memory_limit overrides it)\n";
  }
  if (m.hugepages_total() > 0) {
    o << "hugepages   " << m.hugepages_free() << "/" << m.hugepages_total() << " free of "
      << Bytes(m.hugepage_size_bytes()) << "\n";
  }
  for (const auto& node : n.numa_nodes()) {
    o << "numa " << node.id() << "      cpus " << node.cpus() << ", " << Bytes(node.memory_total_bytes()) << "\n";
  }
  if (n.gpus().empty()) o << "gpus        none: " << n.gpu_problem() << "\n";
  if (!n.gpu_driver().empty()) o << "gpu driver  " << TerminalText(n.gpu_driver()) << "\n";
  for (const auto& g : n.gpus()) {
    o << "gpu " << g.index() << "       " << g.name() << ", " << Bytes(g.total_memory_bytes()) << " ("
      << Bytes(g.free_memory_bytes()) << " free), sm_" << g.compute_capability_major()
      << g.compute_capability_minor() << ", " << g.pci_bus_id() << ", NUMA node "
      << (g.numa_node() >= 0 ? std::to_string(g.numa_node()) : std::string("unknown"))
      << (g.job_id().empty() ? std::string(", free") : ", running " + g.job_id()) << "\n";
  }
  for (const auto& s : n.store_directories()) {
    o << "store       " << s.path() << " weight " << s.weight() << ": "
      << Bytes(s.available_bytes()) << " free of " << Bytes(s.capacity_bytes());
    if (s.measured_read_bytes_per_second() > 0) {
      char rates[96];
      std::snprintf(rates, sizeof(rates), ", read %.2f / write %.2f GB/s%s",
                    s.measured_read_bytes_per_second() / 1e9,
                    s.measured_write_bytes_per_second() / 1e9,
                    s.measured_direct_io() ? " (O_DIRECT)" : " (buffered)");
      o << rates;
    }
    o << (s.problem().empty() ? "" : " — " + s.problem()) << "\n";
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
  // The model families the daemon trains: config.json's model_type, then the architectures it takes.
  for (int i = 0; i < n.supported_families_size(); ++i) {
    const auto& f = n.supported_families(i);
    o << (i == 0 ? "families    " : "            ") << TerminalText(f.model_type()) << " (";
    for (int a = 0; a < f.architectures_size(); ++a) o << (a ? ", " : "") << TerminalText(f.architectures(a));
    o << "): " << TerminalText(f.description()) << "\n";
  }
  return o.str();
}

std::string RenderJob(const offloadd::v1::Job& j) {
  std::ostringstream o;
  o << "job " << TerminalText(j.id()) << "  " << JobStateName(j.state());
  if (!j.spec().display_name().empty())
    o << "  \"" << TerminalText(j.spec().display_name()) << "\"";
  o << "\n";
  if (!j.submitted_by().empty()) o << "  submitted by " << TerminalText(j.submitted_by()) << "\n";
  const auto& p = j.progress();
  if (p.step() > 0) {
    o << "  step " << p.step() << "/" << p.max_steps() << "  loss " << p.loss() << "  lr " << p.learning_rate()
      << "  " << p.tokens_per_second() << " tok/s\n";
  }
  if (!j.spec().output_dir().empty()) o << "  output " << TerminalText(j.spec().output_dir()) << "\n";
  if (j.has_error() && j.error().code() != 0) {
    o << "  error: " << TerminalLines(j.error().message());
    if (!j.error().field_path().empty()) o << " (" << TerminalText(j.error().field_path()) << ")";
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
    // The name is appended, not formatted into `line`: escaped, it may be longer than the buffer.
    std::snprintf(line, sizeof line, "%-24s %-11s %10lld %10.4f  ", TerminalText(j.id()).c_str(),
                  JobStateName(j.state()).c_str(), static_cast<long long>(j.progress().step()),
                  j.progress().loss());
    o << line << TerminalText(j.spec().display_name()) << "\n";
  }
  if (!r.next_page_token().empty())
    o << "(more: next page token " << TerminalText(r.next_page_token()) << ")\n";
  return o.str();
}

std::string RenderCheckpoints(const offloadd::v1::ListCheckpointsResponse& r) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%10s %10s %10s  %-23s  %s\n", "STEP", "LOSS", "SIZE", "CREATED",
                "PATH");
  o << line;
  for (const auto& c : r.checkpoints()) {
    std::snprintf(line, sizeof line, "%10lld %10.4f %10s  %-23s  ", static_cast<long long>(c.step()),
                  c.loss(), Bytes(c.size_bytes()).c_str(),
                  c.has_create_time() ? FormatTime(c.create_time().seconds()).c_str() : "-");
    o << line << TerminalText(c.path()) << "\n";
  }
  if (r.checkpoints().empty()) o << "(no checkpoints)\n";
  return o.str();
}

std::string RenderLogLine(const offloadd::v1::JobEvent& e) {
  std::string level = "info";
  switch (e.log().level()) {
    case offloadd::v1::LOG_LEVEL_DEBUG: level = "debug"; break;
    case offloadd::v1::LOG_LEVEL_WARNING: level = "warning"; break;
    case offloadd::v1::LOG_LEVEL_ERROR: level = "error"; break;
    default: break;
  }
  char head[64];
  std::snprintf(head, sizeof head, "%-23s  %-7s  ",
                e.has_time() ? FormatTime(e.time().seconds()).c_str() : "-", level.c_str());
  return head + TerminalLines(e.log().message()) + "\n";
}

std::string RenderDescription(const JobDescription& d, int last_events, const std::string& spec_text) {
  const auto& j = d.job;
  std::ostringstream o;
  o << RenderJob(j);
  const auto when = [&](const char* what, const google::protobuf::Timestamp& t) {
    if (t.seconds() > 0) o << "  " << what << FormatTime(t.seconds()) << "\n";
  };
  when("created  ", j.create_time());
  when("started  ", j.start_time());
  when("ended    ", j.end_time());
  if (j.state() == offloadd::v1::JOB_STATE_QUEUED) o << "  queue position " << j.queue_position() << "\n";
  o << "\nTransitions:\n";
  for (const auto& t : j.transitions()) {
    o << "  " << (t.has_time() ? FormatTime(t.time().seconds()) : std::string("-")) << "  "
      << JobStateName(t.state()) << (t.reason().empty() ? "" : ": ") << TerminalText(t.reason()) << "\n";
  }
  o << "\nPlacement:\n";
  if (!d.placement_known) {
    o << "  unknown (the node's GPUs could not be read)\n";
  } else if (!d.gpus.empty()) {
    o << "  GPU";
    for (size_t i = 0; i < d.gpus.size(); ++i) o << (i ? "," : " ") << d.gpus[i];
    o << "\n";
  } else {
    o << "  " << (j.state() == offloadd::v1::JOB_STATE_RUNNING ? "CPU (no GPU held)" : "none (not running)")
      << "\n";
  }
  // The latest run's setup: what it logged from its RUNNING transition to its first step (the
  // model, the batch size the planner chose, the memory plan, the node profile).
  std::vector<const offloadd::v1::JobEvent*> setup;
  bool in_setup = false;
  for (const auto& e : d.events) {
    if (e.has_state_change() && e.state_change().state() == offloadd::v1::JOB_STATE_RUNNING) {
      setup.clear();
      in_setup = true;
    } else if (e.has_checkpoint_saved() || (e.has_state_change() && e.state_change().state() !=
                                                                        offloadd::v1::JOB_STATE_RUNNING)) {
      in_setup = false;
    } else if (in_setup && e.has_log()) {
      setup.push_back(&e);
    }
  }
  o << "\nSetup and plan (latest run):\n";
  if (setup.empty()) o << "  (nothing logged yet)\n";
  for (const auto* e : setup) o << "  " << RenderLogLine(*e);
  o << "\nSpec:\n";
  std::istringstream spec(spec_text);
  for (std::string line; std::getline(spec, line);) o << "  " << TerminalText(line) << "\n";
  o << "\nEvents (last " << last_events << "):\n";
  const size_t first = d.events.size() > static_cast<size_t>(last_events)
                           ? d.events.size() - static_cast<size_t>(last_events)
                           : 0;
  for (size_t i = first; i < d.events.size(); ++i) o << "  " << RenderEvent(d.events[i]);
  if (d.events.empty()) o << "  (none)\n";
  o << "\nCheckpoints:\n";
  std::istringstream table(RenderCheckpoints(d.checkpoints));
  for (std::string line; std::getline(table, line);) o << "  " << line << "\n";
  o << "\nOutput directory: "
    << (j.spec().output_dir().empty() ? std::string("(none)") : TerminalText(j.spec().output_dir()))
    << "\n";
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
  if (p.has_eval_loss()) {
    std::snprintf(buf, sizeof buf, "  eval_loss %.4f (step %lld)", p.eval_loss(),
                  static_cast<long long>(p.eval_step()));
    o << buf;
  }
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
  if (e.has_state_change()) {
    o << "state " << JobStateName(e.state_change().state()) << " "
      << TerminalText(e.state_change().reason());
  } else if (e.has_progress()) {
    o << RenderProgressLine(e.progress());
  } else if (e.has_log()) {
    o << TerminalText(e.log().message());
  } else if (e.has_checkpoint_saved()) {
    o << "checkpoint " << TerminalText(e.checkpoint_saved().id()) << " at step "
      << e.checkpoint_saved().step();
  }
  o << "\n";
  return o.str();
}

}  // namespace offloadctl
