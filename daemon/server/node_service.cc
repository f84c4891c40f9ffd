#include "daemon/server/node_service.h"

#include <ctime>

#include "daemon/server/rpc_recorder.h"
#include "engine/model_config.h"
#include "job/host_memory.h"
#include "job/node_profile_file.h"
#include "job/shape_profile.h"
#include "workers/adamw_kernel.h"

namespace offloadd::daemon {

namespace {
bool ParseUtc(const std::string& text, int64_t* seconds) {
  std::tm tm{};
  if (strptime(text.c_str(), "%Y-%m-%dT%H:%M:%SZ", &tm) == nullptr) return false;
  *seconds = timegm(&tm);
  return true;
}
}  // namespace

NodeServiceImpl::NodeServiceImpl(BuildFacts build, std::vector<StoreDirInput> store_dirs,
                                 DaemonMetrics* metrics)
    : build_(std::move(build)),
      store_dirs_(std::move(store_dirs)),
      metrics_(metrics),
      start_unix_seconds_(std::time(nullptr)) {}

grpc::Status NodeServiceImpl::GetNodeInfo(grpc::ServerContext*, const offloadd::v1::GetNodeInfoRequest*,
                                          offloadd::v1::NodeInfo* response) {
  RpcRecorder rec(metrics_, "GetNodeInfo");
  FillNodeInfo(ProbeNode(store_dirs_), build_, response);
  if (gpu_jobs_) {
    const std::map<int, std::string> on = gpu_jobs_();
    for (auto& g : *response->mutable_gpus()) {
      if (auto it = on.find(g.index()); it != on.end()) g.set_job_id(it->second);
    }
  }
  if (serving_problem_) response->set_serving_problem(serving_problem_());
  auto* cpu = response->mutable_cpu();
  for (workers::KernelPath p : workers::SupportedPaths()) {
    cpu->add_adamw_kernels(std::string(workers::KernelPathName(p)));
  }
  // Validated at startup; the environment could only have changed through a restart.
  if (auto k = workers::ResolveKernelPath(adamw_kernel_); k.ok()) {
    cpu->set_adamw_kernel(std::string(workers::KernelPathName(k->path)));
    cpu->set_adamw_kernel_reason(k->reason);
  } else {
    cpu->set_adamw_kernel_reason(k.status().message());
  }
  {
    v1::MemoryInfo* mem = response->mutable_memory();
    // What a GPU job (its arena pinned) that names no limit gets now.
    trainer::NodeMemory node = trainer::ProbeNodeMemory();
    node.pinned = response->gpus_size() > 0;
    const trainer::HostMemoryLimit limit =
        trainer::DefaultHostMemoryLimit(host_memory_limit_, node);
    mem->set_default_host_memory_limit_bytes(limit.bytes);
    mem->set_default_host_memory_limit_source(limit.source);
    mem->set_cgroup_memory_max_bytes(node.cgroup_max);
    mem->set_cgroup_memory_current_bytes(node.cgroup_usage);
    mem->set_host_memory_reserve_bytes(trainer::HostMemoryReserve(node.total));
  }
  response->mutable_start_time()->set_seconds(start_unix_seconds_);
  FillBandwidths(profile_dir_, response->mutable_bandwidths());
  FillStoreRates(profile_dir_, response);
  FillShapeProfiles(profile_dir_, response);
  return rec.Done(grpc::Status::OK);
}

void FillBandwidths(const std::string& dir, offloadd::v1::Bandwidths* out) {
  if (dir.empty()) return;
  const std::string path = dir + "/" + trainer::kNodeProfileFile;
  auto p = trainer::ReadNodeProfile(path);
  if (!p.ok()) {
    out->set_problem(p.status().code() == StatusCode::kNotFound
                         ? "not measured yet: the first job that places its AdamW states "
                           "automatically measures it (" + path + ")"
                         : std::string(p.status().message()));
    return;
  }
  out->set_host_to_device_bytes_per_second(p->h2d_bytes_per_s);
  out->set_device_to_host_bytes_per_second(p->d2h_bytes_per_s);
  out->set_both_directions_bytes_per_second(p->both_bytes_per_s);
  out->set_host_memory_bytes_per_second(p->host_bytes_per_s);
  out->set_adamw_params_per_second(p->cpu_params_per_s);
  out->set_adamw_threads(p->threads);
  out->set_adamw_kernel(p->kernel);
  out->set_profile_key(p->key);
  for (const auto& r : p->adamw_by_threads) {
    auto* t = out->add_adamw_by_threads();
    t->set_threads(r.threads);
    t->set_params_per_second(r.params_per_s);
  }
  out->set_adamw_params_per_second_during_dma(p->cpu_params_per_s_during_dma);
  out->set_store_directory(p->store_dir);
  out->set_store_read_bytes_per_second(p->store_read_bytes_per_s);
  out->set_store_write_bytes_per_second(p->store_write_bytes_per_s);
  out->set_store_direct_io(p->store_direct_io);
  if (int64_t t = 0; ParseUtc(p->measured_at, &t)) out->mutable_measured_at()->set_seconds(t);
}

void FillStoreRates(const std::string& dir, offloadd::v1::NodeInfo* out) {
  if (dir.empty()) return;
  auto p = trainer::ReadNodeProfile(dir + "/" + trainer::kNodeProfileFile);
  if (!p.ok()) return;
  for (auto& s : *out->mutable_store_directories()) {
    for (const auto& r : p->stores) {
      if (r.dir != s.path()) continue;
      s.set_measured_read_bytes_per_second(r.read_bytes_per_s);
      s.set_measured_write_bytes_per_second(r.write_bytes_per_s);
      s.set_measured_direct_io(r.direct_io);
    }
  }
}

void FillShapeProfiles(const std::string& dir, offloadd::v1::NodeInfo* out) {
  if (dir.empty()) return;
  std::vector<std::string> problems;
  for (const auto& p : trainer::ListShapeProfiles(dir, &problems)) {
    auto* s = out->add_shape_profiles();
    s->set_key(p.key);
    s->set_gpu(p.gpu);
    s->set_model(p.model);
    s->set_batch(p.batch);
    s->set_seq(p.seq);
    s->set_dtype(p.dtype);
    if (int64_t t = 0; ParseUtc(p.measured_at, &t)) s->mutable_measured_at()->set_seconds(t);
    s->set_gpu_seconds(p.gpu_seconds);
    s->set_peak_reserved_bytes(p.peak_reserved_bytes);
    s->set_workspace_bytes(p.workspace_bytes);
    for (const auto& b : p.blocks) {
      auto* o = s->add_blocks();
      o->set_name(b.name);
      o->set_mode(b.mode);
      o->set_forward_seconds(b.forward_s);
      o->set_backward_seconds(b.backward_s);
      o->set_recompute_seconds(b.recompute_s);
      o->set_keep_bytes(b.keep_bytes);
      o->set_recompute_bytes(b.recompute_bytes);
      o->set_forward_transient_bytes(b.forward_transient_bytes);
      o->set_backward_transient_bytes(b.backward_transient_bytes);
    }
  }
  for (auto& p : problems) out->add_shape_profile_problems(std::move(p));
}

void FillNodeInfo(const NodeFacts& f, const BuildFacts& build, offloadd::v1::NodeInfo* out) {
  out->set_hostname(f.hostname);
  out->set_kernel_release(f.kernel_release);
  auto* b = out->mutable_build();
  b->set_version(build.version);
  b->set_git_revision(build.revision);
  b->set_torch_version(build.torch_version);
  b->set_cuda(build.cuda);
  auto* cpu = out->mutable_cpu();
  cpu->set_model_name(f.cpu.model_name);
  cpu->set_logical_cores(f.cpu.logical_cores);
  cpu->set_physical_cores(f.cpu.physical_cores);
  cpu->set_avx2(f.cpu.avx2);
  cpu->set_avx512f(f.cpu.avx512f);
  cpu->set_avx512_bf16(f.cpu.avx512_bf16);
  auto* mem = out->mutable_memory();
  mem->set_total_bytes(f.memory.total_bytes);
  mem->set_available_bytes(f.memory.available_bytes);
  mem->set_hugepage_size_bytes(f.memory.hugepage_size_bytes);
  mem->set_hugepages_total(f.memory.hugepages_total);
  mem->set_hugepages_free(f.memory.hugepages_free);
  mem->set_memlock_limit_bytes(f.memory.memlock_limit_bytes);
  mem->set_shm_available_bytes(f.memory.shm_available_bytes);
  for (const auto& n : f.numa_nodes) {
    auto* p = out->add_numa_nodes();
    p->set_id(n.id);
    p->set_cpus(n.cpus);
    p->set_memory_total_bytes(n.memory_total_bytes);
  }
  for (const auto& g : f.gpus) {
    auto* p = out->add_gpus();
    p->set_index(g.index);
    p->set_name(g.name);
    p->set_total_memory_bytes(g.total_memory_bytes);
    p->set_free_memory_bytes(g.free_memory_bytes);
    p->set_compute_capability_major(g.cc_major);
    p->set_compute_capability_minor(g.cc_minor);
    p->set_pci_bus_id(g.pci_bus_id);
    p->set_numa_node(g.numa_node);
  }
  out->set_gpu_problem(f.gpu_problem);
  out->set_gpu_driver(f.gpu_driver);
  for (const auto& s : f.store_dirs) {
    auto* p = out->add_store_directories();
    p->set_path(s.path);
    p->set_weight(s.weight);
    p->set_capacity_bytes(s.capacity_bytes);
    p->set_available_bytes(s.available_bytes);
    p->set_problem(s.problem);
  }
  out->set_io_uring_available(f.io_uring_available);
  out->set_io_uring_problem(f.io_uring_problem);
  for (const engine::FamilyInfo& family : engine::SupportedFamilies()) {
    auto* p = out->add_supported_families();
    p->set_model_type(family.model_type);
    for (const auto& a : family.architectures) p->add_architectures(a);
    p->set_description(family.description);
  }
}

}  // namespace offloadd::daemon
