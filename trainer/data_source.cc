#include "trainer/data_source.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "common/safe_path.h"
#include "job/batch_planner.h"
#include "text/batcher.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/mixture.h"
#include "text/tokenizer.h"

namespace offloadd::trainer {
namespace {

bool IsDir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// The template and (in *origin) where it came from.
StatusOr<text::ChatTemplate> LoadTemplate(const DataConfig& c, const text::Tokenizer& tok,
                                          const std::string& tokenizer_dir, std::string* origin) {
  if (c.chat_template == "builtin") {
    *origin = "offloadd's built-in template (chat_template: builtin)";
    return text::ChatTemplate::BuiltIn(text::SpecialTokens::Guess(tok));
  }
  if (!c.chat_template.empty()) {
    *origin = "the file " + c.chat_template;
    // Confined, a regular file only (common/safe_path.h).
    StatusOr<std::string> source = ReadFileConfined(c.chat_template);
    if (!source.ok()) return source.status().WithContext("chat template");
    auto tokens = text::SpecialTokens::FromTokenizerConfig(tokenizer_dir + "/tokenizer_config.json");
    return text::ChatTemplate::FromString(*source,
                                          tokens.ok() ? *tokens : text::SpecialTokens::Guess(tok));
  }
  auto t = text::ChatTemplate::FromDirectory(tokenizer_dir);
  if (!t.ok() && t.status().code() == StatusCode::kNotFound) {
    *origin = "offloadd's built-in template (the tokenizer has none)";
    return text::ChatTemplate::BuiltIn(text::SpecialTokens::Guess(tok));
  }
  *origin = "the tokenizer's own";
  return t;
}

// splitmix64, for the synthetic token stream.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One dataset's documents as the source trains them: the held-out records or the rest
// (eval_split, before max_samples), then the first max_samples. Adds to the totals `stats`.
StatusOr<std::shared_ptr<const std::vector<text::Document>>> LoadDocuments(
    const DataConfig& config, const DataMixtureSource& source, const text::Tokenizer& tokenizer,
    const text::ChatTemplate& chat, uint64_t seed, text::DatasetStats* stats) {
  text::DatasetOptions dopts;
  ASSIGN_OR_RETURN(dopts.format, text::ParseDatasetFormat(source.format));
  dopts.mask_prompt = source.mask_prompt;
  dopts.skip_bad_records = config.skip_bad_records;
  ASSIGN_OR_RETURN(text::DatasetReader reader,
                   text::DatasetReader::Load(source.paths, tokenizer, &chat, dopts));
  const text::DatasetStats& s = reader.stats();
  stats->records += s.records;
  stats->skipped += s.skipped;
  stats->tokens += s.tokens;
  stats->trained_tokens += s.trained_tokens;
  stats->chat_records += s.chat_records;
  for (const std::string& e : s.first_errors) {
    if (stats->first_errors.size() < 10) stats->first_errors.push_back(e);
  }
  std::shared_ptr<const std::vector<text::Document>> docs = reader.documents();
  if (config.eval_split > 0) {
    ASSIGN_OR_RETURN(std::vector<text::Document> part,
                     text::SplitHeldOut(*docs, config.eval_split, seed, config.held_out));
    docs = std::make_shared<std::vector<text::Document>>(std::move(part));
  }
  if (config.max_samples > 0 && docs->size() > static_cast<size_t>(config.max_samples)) {
    docs = std::make_shared<std::vector<text::Document>>(docs->begin(),
                                                         docs->begin() + config.max_samples);
  }
  return docs;
}

}  // namespace

struct DataSource::Impl {
  DataConfig config;
  int64_t vocab = 0;
  int32_t batch = 0;
  uint64_t seed = 0;
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::unique_ptr<text::ChatTemplate> chat;
  std::optional<DataSource::TemplateUse> template_use;  // set when chat records were rendered
  std::shared_ptr<const std::vector<text::Document>> docs;
  std::unique_ptr<text::Batcher> batcher;
  text::DatasetStats stats;
  std::shared_ptr<const text::Mixture> mixture;  // several datasets mixed by weight
  size_t epoch0_documents = 0;
  uint64_t synthetic_drawn = 0;  // sequences drawn (synthetic mode)
  uint64_t drawn = 0;            // sequences drawn in total
};

DataSource::DataSource(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataSource::~DataSource() = default;

StatusOr<std::unique_ptr<DataSource>> DataSource::Create(const DataConfig& config,
                                                         const std::string& model_dir,
                                                         int64_t vocab_size, int32_t batch_size,
                                                         uint64_t seed) {
  if (batch_size < 1) return InvalidArgumentError("batch size must be at least 1");
  if (config.max_seq_length < 8 && config.synthetic_seq_length <= 0)
    return InvalidArgumentError("max_seq_length must be at least 8");
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->vocab = vocab_size;
  impl->batch = batch_size;
  impl->seed = seed;
  if (config.synthetic_seq_length > 0) {
    std::unique_ptr<DataSource> ds(new DataSource(std::move(impl)));
    ds->sequences_per_epoch_ = 1 << 30;  // endless
    return ds;
  }
  if (config.paths.empty() && config.mixture.empty()) {
    return InvalidArgumentError("no dataset files given");
  }
  if (!config.paths.empty() && !config.mixture.empty()) {  // --data over a job file's mixture
    return InvalidArgumentError("dataset files given besides a mixture of datasets: give one");
  }
  const std::string tok_path = config.tokenizer_path.empty() ? model_dir : config.tokenizer_path;
  auto tok = IsDir(tok_path) ? text::Tokenizer::FromDirectory(tok_path)
                             : text::Tokenizer::FromFile(tok_path);
  if (!tok.ok()) return tok.status().WithContext("tokenizer " + tok_path);
  impl->tokenizer = std::move(*tok);
  const std::string tok_dir = IsDir(tok_path) ? tok_path : DirOf(tok_path);
  std::string origin;
  ASSIGN_OR_RETURN(text::ChatTemplate chat, LoadTemplate(config, *impl->tokenizer, tok_dir, &origin));
  impl->chat = std::make_unique<text::ChatTemplate>(std::move(chat));

  std::shared_ptr<const std::vector<text::Document>> docs;
  std::shared_ptr<const text::Mixture> mixture;
  if (config.mixture.empty()) {
    ASSIGN_OR_RETURN(docs,
                     LoadDocuments(config, {config.paths, 1, config.format, config.mask_prompt},
                                   *impl->tokenizer, *impl->chat, seed, &impl->stats));
  } else {  // each dataset alone, then one after the other, drawn by the mixture's order
    auto all = std::make_shared<std::vector<text::Document>>();
    text::MixtureOptions mo;
    ASSIGN_OR_RETURN(mo.stopping, text::ParseMixtureStopping(config.stopping_strategy));
    mo.shuffle = config.shuffle;
    mo.seed = seed;
    for (size_t i = 0; i < config.mixture.size(); ++i) {
      auto part = LoadDocuments(config, config.mixture[i], *impl->tokenizer, *impl->chat, seed,
                                &impl->stats);
      if (!part.ok()) return part.status().WithContext("datasets[" + std::to_string(i) + "]");
      all->insert(all->end(), (*part)->begin(), (*part)->end());
      mo.sizes.push_back((*part)->size());
      mo.weights.push_back(config.mixture[i].weight);
    }
    docs = all;
    if (!config.held_out) {  // an eval source reads every held-out record once, unmixed
      ASSIGN_OR_RETURN(text::Mixture m, text::Mixture::Create(mo));
      mixture = std::make_shared<const text::Mixture>(std::move(m));
    }
  }
  if (impl->stats.chat_records > 0) {
    impl->template_use = TemplateUse{impl->chat->source(), origin, origin == "the tokenizer's own", tok_dir};
  }
  for (size_t i = 0; i < docs->size(); ++i) {
    for (int32_t id : (*docs)[i].input_ids) {
      if (id < 0 || id >= vocab_size) {
        return InvalidArgumentError("dataset document " + std::to_string(i) + " has token id " +
                                    std::to_string(id) + " outside the model's vocabulary of " +
                                    std::to_string(vocab_size) +
                                    " (does the tokenizer belong to this model?)");
      }
    }
  }
  impl->docs = docs;
  text::BatcherOptions bo;
  bo.max_seq_length = config.max_seq_length;
  bo.packing = config.packing;
  bo.shuffle = config.shuffle;
  bo.seed = seed;
  bo.mixture = mixture;
  impl->mixture = mixture;
  ASSIGN_OR_RETURN(text::Batcher batcher, text::Batcher::Create(docs, bo));
  // Count the sequences of epoch 0 with a throw-away copy.
  text::Batcher counter = batcher;
  int64_t n = 0;
  const size_t epoch0 = mixture ? mixture->EpochOrder(0).size() : docs->size();
  impl->epoch0_documents = epoch0;
  while (counter.cursor().epoch == 0 && counter.cursor().index < epoch0) {
    counter.Next();
    ++n;
  }
  impl->batcher = std::make_unique<text::Batcher>(std::move(batcher));
  std::unique_ptr<DataSource> ds(new DataSource(std::move(impl)));
  ds->sequences_per_epoch_ = std::max<int64_t>(n, 1);
  return ds;
}

StatusOr<MicroBatchData> DataSource::Next() {
  Impl& m = *impl_;
  MicroBatchData out;
  out.batch = m.batch;
  std::vector<text::PackedSequence> seqs;
  seqs.reserve(m.batch);
  for (int32_t b = 0; b < m.batch; ++b) {
    text::PackedSequence s;
    if (m.config.synthetic_seq_length > 0) {
      const int32_t len = m.config.synthetic_seq_length;
      uint64_t state = Mix(m.seed ^ (m.synthetic_drawn * 0x632BE59BD9B4E019ull));
      s.input_ids.resize(len);
      for (int32_t t = 0; t < len; ++t) {
        state = Mix(state);
        s.input_ids[t] = static_cast<int32_t>(state % static_cast<uint64_t>(m.vocab));
      }
      s.labels = s.input_ids;
      s.position_ids.resize(len);
      for (int32_t t = 0; t < len; ++t) s.position_ids[t] = t;
      ++m.synthetic_drawn;
    } else {
      s = m.batcher->Next();
    }
    ++m.drawn;
    seqs.push_back(std::move(s));
  }
  size_t longest = 0;
  for (const auto& s : seqs) longest = std::max(longest, s.input_ids.size());
  const int64_t cap = m.config.synthetic_seq_length > 0 ? m.config.synthetic_seq_length
                                                        : m.config.max_seq_length;
  const bool buckets = m.config.length_buckets.value_or(false) && !m.config.packing &&
                       m.config.synthetic_seq_length == 0;
  const int64_t T = PaddedLength(static_cast<int64_t>(longest), cap, buckets);
  out.seq = T;
  const size_t total = static_cast<size_t>(out.batch * T);
  out.input_ids.assign(total, 0);
  out.targets.assign(total, -100);
  out.position_ids.assign(total, 0);
  if (m.config.packing) out.segment_ids.assign(total, 0);
  for (int64_t b = 0; b < out.batch; ++b) {
    const auto& s = seqs[b];
    const int64_t n = static_cast<int64_t>(s.input_ids.size());
    int32_t last_pos = -1;
    int32_t max_doc = 0;
    for (int64_t t = 0; t < n; ++t) {
      const size_t i = static_cast<size_t>(b * T + t);
      out.input_ids[i] = s.input_ids[t];
      out.position_ids[i] = s.position_ids.empty() ? t : s.position_ids[t];
      last_pos = static_cast<int32_t>(out.position_ids[i]);
      if (t + 1 < n) out.targets[i] = s.labels[t + 1];
      if (m.config.packing) {
        out.segment_ids[i] = s.document_ids.empty() ? 0 : s.document_ids[t];
        max_doc = std::max<int32_t>(max_doc, static_cast<int32_t>(out.segment_ids[i]));
      }
    }
    for (int64_t t = n; t < T; ++t) {  // padding: its own segment, continuing positions
      const size_t i = static_cast<size_t>(b * T + t);
      out.position_ids[i] = ++last_pos;
      if (m.config.packing) out.segment_ids[i] = max_doc + 1;
    }
    out.tokens += n;
  }
  for (int64_t v : out.targets) out.trained_tokens += v != -100;
  return out;
}

double DataSource::epoch() const {
  return static_cast<double>(impl_->drawn) / static_cast<double>(sequences_per_epoch_);
}

std::string DataSource::State() const {
  nlohmann::json j;
  j["drawn"] = impl_->drawn;
  if (impl_->config.synthetic_seq_length > 0) {
    j["synthetic_drawn"] = impl_->synthetic_drawn;
  } else {
    j["batcher"] = nlohmann::json::parse(impl_->batcher->SaveState());
  }
  return j.dump();
}

Status DataSource::Restore(const std::string& state) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state);
    impl_->drawn = j.at("drawn").get<uint64_t>();
    if (impl_->config.synthetic_seq_length > 0) {
      impl_->synthetic_drawn = j.at("synthetic_drawn").get<uint64_t>();
      return OkStatus();
    }
    return impl_->batcher->RestoreState(j.at("batcher").dump());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("data cursor: ") + e.what());
  }
}

const DataSource::TemplateUse* DataSource::template_use() const {
  return impl_->template_use ? &*impl_->template_use : nullptr;
}

std::vector<int64_t> DataSource::SequenceLengths() const {
  const Impl& m = *impl_;
  std::vector<int64_t> out;
  if (m.config.synthetic_seq_length > 0 || m.config.packing || !m.docs) return out;
  out.reserve(m.docs->size());
  for (const auto& d : *m.docs) {
    out.push_back(std::min<int64_t>(static_cast<int64_t>(d.input_ids.size()), m.config.max_seq_length));
  }
  return out;
}

std::string DataSource::Describe() const {
  const Impl& m = *impl_;
  if (m.config.synthetic_seq_length > 0)
    return "synthetic random tokens, " + std::to_string(m.config.synthetic_seq_length) + " per sequence";
  std::string split;
  if (m.config.eval_split > 0) {
    char f[32];
    std::snprintf(f, sizeof f, "%g", m.config.eval_split);
    split = (m.config.held_out ? " held out by eval_split " : " not held out by eval_split ") +
            std::string(f);
  }
  std::string mix;
  if (m.mixture) {
    const text::MixtureOptions& o = m.mixture->options();
    mix = "; a mixture of " + std::to_string(o.sizes.size()) + " datasets (";
    for (size_t i = 0; i < o.sizes.size(); ++i) {
      char w[32];
      std::snprintf(w, sizeof w, "%g", o.weights[i]);
      mix += (i ? ", " : "") + std::to_string(o.sizes[i]) + " documents at weight " + w;
    }
    mix += std::string("; ") + text::MixtureStoppingName(o.stopping) + ": epoch 0 draws " +
           std::to_string(m.epoch0_documents) + ")";
  }
  return std::to_string(m.docs->size()) + " documents" + split + mix + " (" +
         std::to_string(m.stats.skipped) + " skipped), " + std::to_string(m.stats.tokens) +
         " tokens, " + std::to_string(m.stats.trained_tokens) + " trained; " +
         std::to_string(sequences_per_epoch_) + " sequences per epoch" +
         (m.template_use
              ? "; " + std::to_string(m.stats.chat_records) + " records rendered with " +
                    m.template_use->origin + " chat template, which the exported model carries"
              : "");
}

int64_t TotalSteps(int64_t max_steps, double num_train_epochs, int64_t sequences_per_epoch,
                   int32_t batch_size, int32_t accumulation_steps) {
  if (max_steps > 0) return max_steps;
  const int64_t micro = (sequences_per_epoch + batch_size - 1) / batch_size;
  const int64_t per_epoch = std::max<int64_t>(1, micro / std::max(1, accumulation_steps));
  return std::max<int64_t>(
      1, static_cast<int64_t>(std::ceil(num_train_epochs * static_cast<double>(per_epoch))));
}

}  // namespace offloadd::trainer
