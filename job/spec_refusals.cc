#include "job/spec_refusals.h"

#include <algorithm>

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

void CheckPathBytes(const v1::JobSpec& s, std::vector<FieldViolation>* out) {
  const auto check = [&](const std::string& field, const std::string& path) {
    if (const size_t at = path.find('\0'); at != std::string::npos) {
      out->push_back({field, "holds a NUL byte at offset " + std::to_string(at) +
                                 "; a path cannot (it would be cut there)"});
    }
  };
  check("model.path", s.model().path());
  check("tokenizer.path", s.tokenizer().path());
  check("dataset.template", s.dataset().template_());
  check("output_dir", s.output_dir());
  check("resume_from_checkpoint", s.resume_from_checkpoint());
  check("offload.offload_optimizer.nvme_path", s.offload().offload_optimizer().nvme_path());
  check("offload.offload_param.nvme_path", s.offload().offload_param().nvme_path());
  for (int i = 0; i < s.dataset().paths_size(); ++i) {
    check("dataset.paths[" + std::to_string(i) + "]", s.dataset().paths(i));
  }
  for (int i = 0; i < s.dataset().eval_paths_size(); ++i) {
    check("dataset.eval_paths[" + std::to_string(i) + "]", s.dataset().eval_paths(i));
  }
  for (int i = 0; i < s.dataset().datasets_size(); ++i) {
    const std::string where = "dataset.datasets[" + std::to_string(i) + "]";
    const v1::DatasetSource& d = s.dataset().datasets(i);
    for (int j = 0; j < d.paths_size(); ++j)
      check(where + ".paths[" + std::to_string(j) + "]", d.paths(j));
    check(where + ".template", d.template_());
  }
}

namespace {

// Whether canonical path `inner` is `outer` or lies below it.
bool SameOrInside(const std::string& inner, const std::string& outer) {
  if (inner.size() < outer.size() || inner.compare(0, outer.size(), outer) != 0) return false;
  return inner.size() == outer.size() || outer == "/" || inner[outer.size()] == '/';
}

}  // namespace

void CheckOutputApartFromModel(const std::string& output_dir, const std::string& model_dir,
                               std::vector<FieldViolation>* out) {
  std::string dir = output_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir == model_dir) {
    out->push_back(
        {"output_dir", "is model.path (" + model_dir +
                           "): the job would write its checkpoints and export over the model it "
                           "reads; give a directory of its own"});
  } else if (SameOrInside(dir, model_dir)) {
    out->push_back({"output_dir", "lies inside model.path (" + model_dir +
                                      "); give a directory outside the model"});
  } else if (SameOrInside(model_dir, dir)) {
    out->push_back(
        {"output_dir", "contains model.path (" + model_dir +
                           "): the export would mix with the model's files; give a directory that "
                           "does not hold the model"});
  }
}

Status CheckArrayElements(const std::string& path, const std::vector<text::RawRecord>& records) {
  for (const text::RawRecord& rec : records) {
    if (rec.text.empty()) {
      return InvalidArgumentError(
          path + ":" + std::to_string(rec.line) +
          ": an empty element in the JSON array (a trailing comma, or two commas in a row)");
    }
  }
  return OkStatus();
}

int64_t TrainedTokens(const text::Document& doc, int64_t max_seq_length) {
  const size_t n =
      std::min(doc.labels.size(), static_cast<size_t>(std::max<int64_t>(max_seq_length, 0)));
  int64_t trained = 0;
  for (size_t t = 1; t < n; ++t) trained += doc.labels[t] != text::kIgnoreIndex;
  return trained;
}

void CheckSomethingTrains(const v1::DatasetSpec& ds, const DataPreviewSummary& data, bool clean,
                          std::vector<FieldViolation>* out) {
  if (!clean || !data.whole || data.trained_tokens > 0 || ds.paths_size() == 0) return;
  out->push_back({"dataset.paths",
                  "no record has a token to train on: every label is masked (-100) within "
                  "dataset.max_seq_length (" +
                      std::to_string(ds.max_seq_length()) + ")" +
                      (ds.mask_prompt() ? " with mask_prompt on" : "") +
                      "; the job would end at once with the model unchanged. Give records "
                      "with completions (or trained labels), or set dataset.mask_prompt: false"});
}

}  // namespace offloadd::daemon
