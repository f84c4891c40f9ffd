#include "job/dataset_mixture_checks.h"

#include <cmath>
#include <sstream>

#include "text/mixture.h"

namespace offloadd::daemon {

namespace v1 = offloadd::v1;

namespace {

std::string Where(int i) { return "dataset.datasets[" + std::to_string(i) + "]"; }

}  // namespace

void CheckMixtureSizes(const v1::DatasetSpec& ds, size_t max_paths, size_t max_path_bytes,
                       Checker& c) {
  size_t files = 0;
  for (int i = 0; i < ds.datasets_size(); ++i) {
    const v1::DatasetSource& d = ds.datasets(i);
    files += static_cast<size_t>(d.paths_size());
    for (int j = 0; j < d.paths_size(); ++j) {
      if (d.paths(j).size() > max_path_bytes) {
        c.Add(Where(i) + ".paths[" + std::to_string(j) + "]",
              std::to_string(d.paths(j).size()) + " bytes, more than the " +
                  std::to_string(max_path_bytes) + " allowed (PATH_MAX is 4096)");
      }
    }
    if (d.template_().size() > max_path_bytes) {
      c.Add(Where(i) + ".template", std::to_string(d.template_().size()) +
                                        " bytes, more than the " + std::to_string(max_path_bytes) +
                                        " allowed");
    }
  }
  if (files > max_paths) {
    c.Add("dataset.datasets", std::to_string(files) + " files in all, more than the " +
                                  std::to_string(max_paths) + " allowed");
  }
}

void CheckMixture(v1::JobSpec& spec, const PathPolicy& paths, Checker& c) {
  const v1::DatasetSpec& ds = spec.dataset();
  if (ds.datasets_size() == 0) {
    if (!ds.stopping_strategy().empty()) {
      c.Add("dataset.stopping_strategy", "set without dataset.datasets (a mixture to stop)");
    }
    return;
  }
  if (ds.paths_size() > 0) {
    c.Add("dataset.datasets",
          "given with dataset.paths: give the files as one dataset (paths) or as a weighted "
          "mixture (datasets), not both");
  }
  if (auto s = text::ParseMixtureStopping(ds.stopping_strategy()); !s.ok()) {
    c.Add("dataset.stopping_strategy",
          "'" + ds.stopping_strategy() +
              "': expected first_exhausted or all_exhausted (Hugging Face's "
              "all_exhausted_without_replacement is not implemented)");
  }
  for (int i = 0; i < ds.datasets_size(); ++i) {
    const v1::DatasetSource& d = ds.datasets(i);
    if (d.paths_size() == 0) c.Add(Where(i) + ".paths", "required: at least one file");
    if (!(std::isfinite(d.weight()) && d.weight() > 0)) {
      std::ostringstream o;
      o << "must be finite and > 0 (its share of the draws), got " << d.weight();
      c.Add(Where(i) + ".weight", o.str());
    }
    if (!v1::DatasetFormat_IsValid(d.format())) {
      c.Add(Where(i) + ".format", "unknown value " + std::to_string(d.format()));
    }
    if (d.template_().empty() || d.template_() == ds.template_()) continue;
    std::string resolved = d.template_();
    if (resolved != "builtin") {
      auto real = paths.ResolveExisting(resolved);
      if (c.Fails(Where(i) + ".template", real.status())) continue;
      resolved = *real;
    }
    if (resolved == ds.template_()) {
      spec.mutable_dataset()->mutable_datasets(i)->set_template_(resolved);
      continue;
    }
    c.Add(Where(i) + ".template",
          "'" + d.template_() + "' is not the job's chat template (dataset.template: " +
              (ds.template_().empty() ? std::string("the tokenizer's own")
                                      : "'" + ds.template_() + "'") +
              "): the records of one job are rendered with one template, the one its exported "
              "model carries, so datasets with different templates cannot be mixed");
  }
}

v1::DatasetSpec MixtureSourceSpec(const v1::DatasetSpec& ds, const v1::DatasetSource& source) {
  v1::DatasetSpec one = ds;
  one.clear_datasets();
  one.clear_stopping_strategy();
  *one.mutable_paths() = source.paths();
  if (source.format() != v1::DATASET_FORMAT_UNSPECIFIED) one.set_format(source.format());
  if (source.has_mask_prompt()) one.set_mask_prompt(source.mask_prompt());
  return one;
}

}  // namespace offloadd::daemon
