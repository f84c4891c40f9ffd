#include "client/offloadctl/render.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace offloadctl {
namespace {

TEST(RenderTest, ProgressLineHasBarPercentAndEta) {
  offloadd::v1::JobProgress p;
  p.set_step(250);
  p.set_max_steps(1000);
  p.set_loss(2.34567);
  p.set_learning_rate(3e-4);
  p.set_tokens_per_second(1234.4);
  p.mutable_eta()->set_seconds(3600 + 12 * 60 + 34);
  EXPECT_EQ(RenderProgressLine(p, 8),
            "step 250/1000 [##......]  25%  loss 2.3457  lr 3.0e-04  1234 tok/s  ETA 1:12:34");
}

TEST(RenderTest, ProgressWithoutMaxStepsOrEta) {
  offloadd::v1::JobProgress p;
  p.set_step(7);
  p.set_loss(1.5);
  EXPECT_EQ(RenderProgressLine(p), "step 7  loss 1.5000  lr 0.0e+00  0 tok/s");
}

// The latest evaluation, as the Python SDK's render_progress_line shows it.
TEST(RenderTest, ProgressWithAnEvaluation) {
  offloadd::v1::JobProgress p;
  p.set_step(8);
  p.set_loss(1.5);
  p.set_eval_loss(1.25);
  p.set_eval_step(8);
  EXPECT_EQ(RenderProgressLine(p),
            "step 8  loss 1.5000  lr 0.0e+00  0 tok/s  eval_loss 1.2500 (step 8)");
}

TEST(RenderTest, FullBarAtTheEnd) {
  offloadd::v1::JobProgress p;
  p.set_step(10);
  p.set_max_steps(10);
  EXPECT_NE(RenderProgressLine(p, 4).find("[####] 100%"), std::string::npos);
}

TEST(RenderTest, NodeInfoShowsEachGpusNumaNode) {
  offloadd::v1::NodeInfo n;
  auto* g = n.add_gpus();
  g->set_name("NVIDIA H200");
  g->set_pci_bus_id("0000:3B:00.0");
  g->set_numa_node(1);
  auto* unknown = n.add_gpus();
  unknown->set_index(1);
  unknown->set_numa_node(-1);
  unknown->set_job_id("job-1");
  const std::string text = RenderNodeInfo(n);
  EXPECT_NE(text.find("0000:3B:00.0, NUMA node 1, free\n"), std::string::npos) << text;
  EXPECT_NE(text.find("NUMA node unknown, running job-1\n"), std::string::npos) << text;
}

// A GPU node whose NVIDIA driver is too old for the bundled CUDA says so, with the driver.
TEST(RenderTest, NodeInfoShowsAGpuDriverThatIsTooOld) {
  offloadd::v1::NodeInfo n;
  n.set_gpu_problem("the NVIDIA driver 570.86.15 supports CUDA 12.8, but this offloadd's CUDA runtime is "
                    "13.0 and needs driver >= 580 (R580 or newer)");
  n.set_gpu_driver("570.86.15 (CUDA 12.8)");
  const std::string text = RenderNodeInfo(n);
  EXPECT_NE(text.find("gpus        none: the NVIDIA driver 570.86.15 supports CUDA 12.8, but this "
                      "offloadd's CUDA runtime is 13.0 and needs driver >= 580"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("gpu driver  570.86.15 (CUDA 12.8)\n"), std::string::npos) << text;
}

TEST(RenderTest, NodeInfoShowsTheAdamWKernelAndWhy) {
  offloadd::v1::NodeInfo n;
  n.mutable_cpu()->set_adamw_kernel("avx2");
  n.mutable_cpu()->set_adamw_kernel_reason("OFFLOADD_ADAMW_KERNEL=avx2");
  n.mutable_cpu()->add_adamw_kernels("avx2");
  n.mutable_cpu()->add_adamw_kernels("portable");
  const std::string text = RenderNodeInfo(n);
  EXPECT_NE(text.find("adamw       avx2 kernel (OFFLOADD_ADAMW_KERNEL=avx2); supported: avx2 portable\n"),
            std::string::npos)
      << text;
}

TEST(RenderTest, NodeInfoListsTheSupportedModelFamilies) {
  offloadd::v1::NodeInfo n;
  auto* q = n.add_supported_families();
  q->set_model_type("qwen3");
  q->add_architectures("Qwen3ForCausalLM");
  q->set_description("Qwen3: per-head q/k RMSNorm");
  auto* g = n.add_supported_families();
  g->set_model_type("gemma3");
  g->add_architectures("Gemma3ForConditionalGeneration");
  g->set_description("Gemma 3 (multimodal\x1b[2J checkpoint)");
  const std::string text = RenderNodeInfo(n);
  EXPECT_NE(text.find("families    qwen3 (Qwen3ForCausalLM): Qwen3: per-head q/k RMSNorm\n"
                      "            gemma3 (Gemma3ForConditionalGeneration): Gemma 3 (multimodal"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << "terminal escapes are escaped";
}

TEST(RenderTest, NodeInfoShowsTheNodeProfileOrWhyThereIsNone) {
  offloadd::v1::NodeInfo n;
  n.mutable_bandwidths()->set_problem("not measured yet");
  EXPECT_NE(RenderNodeInfo(n).find("profile     not measured yet\n"), std::string::npos);
  auto* b = n.mutable_bandwidths();
  b->set_host_memory_bytes_per_second(105.6e9);
  b->set_adamw_params_per_second(3.84e9);
  b->set_adamw_threads(15);
  b->set_adamw_kernel("avx512bf16");
  b->set_host_to_device_bytes_per_second(54.7e9);
  b->set_device_to_host_bytes_per_second(54.7e9);
  b->set_both_directions_bytes_per_second(94.5e9);
  b->mutable_measured_at()->set_seconds(1795560426);  // 2026-11-24 22:47:06 UTC
  const std::string text = RenderNodeInfo(n);
  EXPECT_NE(text.find("profile     host memory 105.6 GB/s, AdamW 3.84 G params/s (15 threads, avx512bf16), "
                      "PCIe H2D 54.7 / D2H 54.7 / both 94.5 GB/s, measured 2026-11-24 22:47:06 UTC\n"),
            std::string::npos)
      << text;
}

// What the default host limit is made of, and each store directory's free space and measured rates.
TEST(RenderTest, NodeInfoShowsTheHostLimitsInputsAndEachStoresRates) {
  offloadd::v1::NodeInfo n;
  auto* m = n.mutable_memory();
  m->set_total_bytes(100ull << 30);
  m->set_available_bytes(90ull << 30);
  m->set_cgroup_memory_max_bytes(95ull << 30);
  m->set_cgroup_memory_current_bytes(1ull << 30);
  m->set_default_host_memory_limit_bytes(84ull << 30);
  m->set_default_host_memory_limit_source(
      "the default: what this node can give now, 90 GiB available less a "
      "reserve of 6 GiB");
  auto* s = n.add_store_directories();
  s->set_path("/nvme0/offloadd");
  s->set_weight(1);
  s->set_available_bytes(500ull << 30);
  s->set_capacity_bytes(1000ull << 30);
  s->set_measured_read_bytes_per_second(6.1e9);
  s->set_measured_write_bytes_per_second(4.2e9);
  s->set_measured_direct_io(true);
  const std::string text = RenderNodeInfo(n);
  EXPECT_NE(text.find("memlock unlimited, cgroup 1 GiB used of 95 GiB\n"), std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          "host limit  84 GiB per job by default (the default: what this node can give now, 90 GiB "
          "available less a reserve of 6 GiB;"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("store       /nvme0/offloadd weight 1: 500 GiB free of 1000 GiB, read 6.10 / "
                      "write 4.20 GB/s "
                      "(O_DIRECT)\n"),
            std::string::npos)
      << text;
}

// Issue #29 item 13: what users put in a spec reaches the terminal escaped.
TEST(RenderTest, TerminalTextEscapesControlsAndKeepsLetters) {
  EXPECT_EQ(TerminalText("caf\u00e9 \u65e5\u672c tab\there"), "caf\u00e9 \u65e5\u672c tab\\there");
  EXPECT_EQ(TerminalText("a\x1b[2Jb\x07"
                         "c\x7f\r\n"),
            "a\\x1b[2Jb\\x07c\\x7f\\x0d\\n");
  EXPECT_EQ(TerminalText(std::string("nul\0end", 7)), "nul\\x00end");
  EXPECT_EQ(TerminalText("\xc2\x9b"
                         "31m"),
            "\\u009b31m");  // C1 CSI
  EXPECT_EQ(TerminalText("\xe2\x80\xae"
                         "abc"),
            "\\u202eabc");                                  // right-to-left override
  EXPECT_EQ(TerminalText("bad\xff\xc3"), "bad\\xff\\xc3");  // invalid UTF-8
  EXPECT_EQ(TerminalLines("one\x1b]0;t\x07\ntwo"), "one\\x1b]0;t\\x07\ntwo");
}

TEST(RenderTest, JobListAndJobEscapeDisplayNamesAndErrors) {
  offloadd::v1::ListJobsResponse r;
  auto* j = r.add_jobs();
  j->set_id("job-1");
  const std::string name = "n\x1b]0;pwned\x07" + std::string(300, 'y') + "\nforged";
  j->mutable_spec()->set_display_name(name);
  const std::string list = RenderJobList(r);
  EXPECT_EQ(list.find('\x1b'), std::string::npos) << list;
  EXPECT_EQ(list.find('\x07'), std::string::npos) << list;
  // One header line and one job line, the whole (escaped) name on it.
  EXPECT_EQ(std::count(list.begin(), list.end(), '\n'), 2) << list;
  EXPECT_NE(list.find("n\\x1b]0;pwned\\x07" + std::string(300, 'y') + "\\nforged\n"),
            std::string::npos)
      << list;

  offloadd::v1::Job job;
  job.set_id("job-1");
  job.mutable_spec()->set_display_name(
      "\xe2\x80\xae"
      "gpj.exe");
  job.mutable_error()->set_code(3);
  job.mutable_error()->set_message("line one\x1b[8m\nline two");
  const std::string text = RenderJob(job);
  EXPECT_NE(text.find("\"\\u202egpj.exe\""), std::string::npos) << text;
  EXPECT_NE(text.find("error: line one\\x1b[8m\nline two"), std::string::npos) << text;

  offloadd::v1::JobEvent e;
  e.mutable_log()->set_message("log\x1b[2K\rhidden");
  EXPECT_EQ(RenderEvent(e), "[0] log\\x1b[2K\\x0dhidden\n");
}

}  // namespace
}  // namespace offloadctl
