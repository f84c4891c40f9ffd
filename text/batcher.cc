#include "text/batcher.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "text/json_guard.h"

namespace offloadd::text {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<uint32_t> Batcher::EpochOrder(size_t n, uint64_t seed, uint64_t epoch, bool shuffle) {
  std::vector<uint32_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  if (!shuffle || n < 2) return order;
  uint64_t state = seed ^ (epoch * 0x9E3779B97F4A7C15ull);
  for (size_t i = n - 1; i >= 1; --i) {
    const size_t j = static_cast<size_t>(SplitMix64(&state) % (i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

StatusOr<Batcher> Batcher::Create(std::shared_ptr<const std::vector<Document>> documents,
                                  const BatcherOptions& options) {
  if (options.max_seq_length < 1) return InvalidArgumentError("max_seq_length must be >= 1");
  if (!documents || documents->empty()) return InvalidArgumentError("no documents to batch");
  if (documents->size() > UINT32_MAX) return InvalidArgumentError("too many documents");
  if (options.mixture && options.mixture->total() != documents->size()) {
    return InvalidArgumentError("the mixture's datasets hold " +
                                std::to_string(options.mixture->total()) + " documents, not " +
                                std::to_string(documents->size()));
  }
  bool usable = false;
  for (const Document& d : *documents) {
    if (d.input_ids.size() != d.labels.size()) {
      return InvalidArgumentError("a document has input_ids and labels of different lengths");
    }
    usable = usable || (!d.input_ids.empty() &&
                        (!options.drop_overlong ||
                         d.input_ids.size() <= static_cast<size_t>(options.max_seq_length)));
  }
  if (!usable) {
    return InvalidArgumentError("no document fits: all are empty or longer than max_seq_length " +
                                std::to_string(options.max_seq_length) + " with drop_overlong");
  }
  return Batcher(std::move(documents), options);
}

void Batcher::EnsureOrder() {
  if (order_epoch_ == cursor_.epoch) return;
  order_ = options_.mixture
               ? options_.mixture->EpochOrder(cursor_.epoch)
               : EpochOrder(docs_->size(), options_.seed, cursor_.epoch, options_.shuffle);
  order_epoch_ = cursor_.epoch;
}

PackedSequence Batcher::Next() {
  PackedSequence seq;
  const size_t max = static_cast<size_t>(options_.max_seq_length);
  while (true) {
    EnsureOrder();
    if (cursor_.index >= order_.size()) {
      ++cursor_.epoch;
      cursor_.index = 0;
      if (!seq.input_ids.empty()) break;
      continue;
    }
    const uint32_t source = order_[cursor_.index];
    const Document& d = (*docs_)[source];
    size_t len = d.input_ids.size();
    if (len == 0) {
      ++cursor_.index;
      continue;
    }
    if (len > max) {
      if (options_.drop_overlong) {
        ++stats_.dropped;
        ++cursor_.index;
        continue;
      }
      len = max;
    }
    if (!seq.input_ids.empty() && (!options_.packing || seq.input_ids.size() + len > max)) break;
    if (len < d.input_ids.size()) ++stats_.truncated;
    const auto doc_index = static_cast<int32_t>(seq.sources.size());
    if (seq.cu_seqlens.empty()) seq.cu_seqlens.push_back(0);
    seq.input_ids.insert(seq.input_ids.end(), d.input_ids.begin(), d.input_ids.begin() + len);
    const size_t first_label = seq.labels.size();
    seq.labels.insert(seq.labels.end(), d.labels.begin(), d.labels.begin() + len);
    seq.labels[first_label] = kIgnoreIndex;
    for (size_t p = 0; p < len; ++p) {
      seq.position_ids.push_back(static_cast<int32_t>(p));
      seq.document_ids.push_back(doc_index);
    }
    seq.cu_seqlens.push_back(static_cast<int32_t>(seq.input_ids.size()));
    seq.sources.push_back(source);
    ++cursor_.index;
    if (seq.input_ids.size() == max || !options_.packing) break;
  }
  Finish(&seq);
  return seq;
}

void Batcher::Finish(PackedSequence* seq) const {
  if (!options_.pad_id) return;
  const size_t max = static_cast<size_t>(options_.max_seq_length);
  const size_t pad = max - seq->input_ids.size();
  seq->input_ids.insert(seq->input_ids.end(), pad, *options_.pad_id);
  seq->labels.insert(seq->labels.end(), pad, kIgnoreIndex);
  seq->position_ids.insert(seq->position_ids.end(), pad, 0);
  seq->document_ids.insert(seq->document_ids.end(), pad, -1);
}

std::string Batcher::SaveState() const {
  nlohmann::json j = {{"epoch", cursor_.epoch},
                      {"index", cursor_.index},
                      {"seed", options_.seed},
                      {"num_documents", docs_->size()},
                      {"max_seq_length", options_.max_seq_length},
                      {"packing", options_.packing},
                      {"shuffle", options_.shuffle}};
  if (options_.mixture) j["mixture"] = options_.mixture->Fingerprint();
  return j.dump();
}

Status Batcher::RestoreState(std::string_view state) {
  return GuardJson(std::string("batcher state"), [&]() -> Status {
    nlohmann::json j = nlohmann::json::parse(state, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("epoch") ||
        !j["epoch"].is_number_unsigned() || !j.contains("index") ||
        !j["index"].is_number_unsigned()) {
      return InvalidArgumentError("batcher state: expected {\"epoch\": N, \"index\": N, ...}");
    }
    auto mismatch = [&](const char* key, const nlohmann::json& want) -> Status {
      if (j.contains(key) && j[key] != want) {
        return FailedPreconditionError(std::string("batcher state was saved with ") + key + "=" +
                                       j[key].dump() + ", now " + want.dump());
      }
      return OkStatus();
    };
    RETURN_IF_ERROR(mismatch("seed", options_.seed));
    RETURN_IF_ERROR(mismatch("num_documents", docs_->size()));
    RETURN_IF_ERROR(mismatch("max_seq_length", options_.max_seq_length));
    RETURN_IF_ERROR(mismatch("packing", options_.packing));
    RETURN_IF_ERROR(mismatch("shuffle", options_.shuffle));
    const std::string mixture = options_.mixture ? options_.mixture->Fingerprint() : "";
    if (j.value("mixture", std::string()) != mixture) {
      return FailedPreconditionError("batcher state was saved for the mixture '" +
                                     j.value("mixture", std::string()) + "', now '" + mixture +
                                     "'");
    }
    const uint64_t index = j["index"].get<uint64_t>();
    const uint64_t epoch = j["epoch"].get<uint64_t>();
    const size_t epoch_size =
        options_.mixture ? options_.mixture->EpochOrder(epoch).size() : docs_->size();
    if (index > epoch_size) return InvalidArgumentError("batcher state: index past the epoch");
    cursor_ = {epoch, index};
    order_epoch_.reset();
    return OkStatus();
  });
}

}  // namespace offloadd::text
