// offloadctl metrics: a job's metrics history (ListJobMetrics), every page, as CSV, JSON, YAML or
// a table.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "client/offloadctl/commands/commands.h"
#include "client/offloadctl/commands/print.h"
#include "client/offloadctl/exit_codes.h"

namespace offloadctl {
namespace {

using offloadd::v1::StepMetrics;

// A double that reads back to the same value (17 significant digits); "" when absent.
std::string Cell(bool has, double v) {
  if (!has) return "";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string Csv(const offloadd::v1::ListJobMetricsResponse& all) {
  std::string out =
      "step,epoch,loss,learning_rate,grad_norm,tokens_per_second,aux_loss,eval_loss\n";
  for (const StepMetrics& m : all.metrics()) {
    out += std::to_string(m.step()) + "," + Cell(true, m.epoch()) + "," +
           Cell(m.has_loss(), m.loss()) + "," + Cell(m.has_learning_rate(), m.learning_rate()) +
           "," + Cell(m.has_grad_norm(), m.grad_norm()) + "," +
           Cell(m.has_tokens_per_second(), m.tokens_per_second()) + "," +
           Cell(m.has_aux_loss(), m.aux_loss()) + "," + Cell(m.has_eval_loss(), m.eval_loss()) +
           "\n";
  }
  return out;
}

std::string Short(bool has, const char* format, double v) {
  if (!has) return "-";
  char buf[40];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string Table(const offloadd::v1::ListJobMetricsResponse& all) {
  std::string out;
  char line[200];
  std::snprintf(line, sizeof line, "%8s %8s %10s %9s %10s %10s %10s\n", "STEP", "EPOCH", "LOSS",
                "LR", "GRAD_NORM", "TOK/S", "EVAL_LOSS");
  out += line;
  for (const StepMetrics& m : all.metrics()) {
    std::snprintf(line, sizeof line, "%8" PRId64 " %8.3f %10s %9s %10s %10s %10s\n", m.step(),
                  m.epoch(), Short(m.has_loss(), "%.4f", m.loss()).c_str(),
                  Short(m.has_learning_rate(), "%.2e", m.learning_rate()).c_str(),
                  Short(m.has_grad_norm(), "%.4f", m.grad_norm()).c_str(),
                  Short(m.has_tokens_per_second(), "%.0f", m.tokens_per_second()).c_str(),
                  Short(m.has_eval_loss(), "%.4f", m.eval_loss()).c_str());
    out += line;
  }
  if (all.metrics().empty()) out += "(no steps recorded)\n";
  return out;
}

}  // namespace

int RunMetrics(offloadd::client::Client& c, const Options& o) {
  // Every page: the rows a job has are bounded (the daemon's cap), 10000 a call.
  offloadd::v1::ListJobMetricsResponse all;
  offloadd::v1::ListJobMetricsRequest req;
  req.set_job_id(o.job_id);
  req.set_limit(10000);
  if (o.after_step >= 0) req.set_after_step(o.after_step);
  while (true) {
    auto page = c.ListJobMetrics(req);
    if (!page.ok()) return Fail("metrics", page.status());
    all.set_capped(page->capped());
    for (auto& m : *page->mutable_metrics()) *all.add_metrics() = std::move(m);
    if (!page->has_more() || all.metrics().empty()) break;
    req.set_after_step(all.metrics().rbegin()->step());
  }
  if (all.capped()) {
    std::fprintf(stderr,
                 "offloadctl: metrics: job %s reached the daemon's cap of rows per job; later "
                 "steps were not "
                 "recorded (its events say from which step)\n",
                 TerminalText(o.job_id).c_str());
  }
  if (o.output == "csv") {
    std::fputs(Csv(all).c_str(), stdout);
    return kExitOk;
  }
  Print(all, o.format(), Table(all));
  return kExitOk;
}

}  // namespace offloadctl
