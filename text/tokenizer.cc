#include "text/tokenizer.h"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "common/safe_path.h"
#include "text/added_tokens.h"
#include "text/bpe_model.h"
#include "text/components.h"
#include "text/json_guard.h"
#include "text/sentencepiece_model.h"
#include "text/unicode.h"

namespace offloadd::text {

using json = nlohmann::json;

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

// Confined to the allowed roots, regular files only (common/safe_path.h).
StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  StatusOr<std::string> text = ReadFileConfined(path);
  if (!text.ok()) return text.status().WithContext("tokenizer file");
  return FromJson(*text, path);
}

namespace {

StatusOr<std::string> ReadFile(const std::string& path) { return ReadFileConfined(path); }

// The id of `content` among the added tokens or the model vocab of a tokenizer.json.
std::optional<int64_t> FindId(const json& j, const std::string& content) {
  for (const auto& a : j.value("added_tokens", json::array())) {
    if (a.is_object() && a.value("content", "") == content && a.contains("id")) {
      return a["id"].get<int64_t>();
    }
  }
  auto model = j.find("model");
  if (model == j.end() || !model->is_object()) return std::nullopt;
  auto vocab = model->find("vocab");
  if (vocab == model->end() || !vocab->is_object()) return std::nullopt;
  auto it = vocab->find(content);
  if (it != vocab->end() && it->is_number_integer()) return it->get<int64_t>();
  return std::nullopt;
}

std::string ConfigToken(const json& config, const char* key, const char* fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  return "";
}

// Rebuilds the normalizer, pre-tokenizer and decoder of a Llama-class tokenizer.json the way
// transformers' LlamaTokenizer does from the SentencePiece model when tokenizer_config.json sets
// add_prefix_space (see tokenizer.h).
void RebuildLlamaPipeline(const json& config, json* j) {
  const bool add_prefix_space = config.value("add_prefix_space", true);
  const bool legacy = config.contains("legacy") && config["legacy"].is_boolean()
                          ? config["legacy"].get<bool>()
                          : false;
  (*j)["normalizer"] = nullptr;
  constexpr const char* kMetaspace = "\xE2\x96\x81";  // U+2581
  (*j)["pre_tokenizer"] = {
      {"type", "Metaspace"},
      {"replacement", kMetaspace},
      {"split", false},
      {"prepend_scheme", add_prefix_space ? (legacy ? "always" : "first") : "never"}};
  json decoders =
      json::array({{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
                   {{"type", "ByteFallback"}},
                   {{"type", "Fuse"}}});
  if (add_prefix_space) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  (*j)["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
}

// A Llama-class tokenizer directory (see tokenizer.h): BOS/EOS from tokenizer_config.json, the
// file's own normalizer and pre-tokenizer unless add_prefix_space asks for a rebuild.
Status ApplyLlamaTokenizerClass(const json& config, json* j, const std::string& where) {
  auto prefix = config.find("add_prefix_space");
  if (prefix != config.end() && prefix->is_boolean()) RebuildLlamaPipeline(config, j);
  json single = json::array(), specials = json::object();
  auto add = [&](const std::string& token) -> Status {
    auto id = FindId(*j, token);
    if (!id)
      return InvalidArgumentError(where + ": special token \"" + token + "\" is not in the vocab");
    single.push_back({{"SpecialToken", {{"id", token}, {"type_id", 0}}}});
    specials[token] = {{"id", token}, {"ids", {*id}}, {"tokens", {token}}};
    return OkStatus();
  };
  const std::string bos = ConfigToken(config, "bos_token", "<s>");
  const std::string eos = ConfigToken(config, "eos_token", "</s>");
  if (config.value("add_bos_token", true) && !bos.empty()) RETURN_IF_ERROR(add(bos));
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (config.value("add_eos_token", false) && !eos.empty()) RETURN_IF_ERROR(add(eos));
  (*j)["post_processor"] = {
      {"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  return GuardJson(dir, [&]() -> StatusOr<std::unique_ptr<Tokenizer>> {
    const std::string path = dir + "/tokenizer.json";
    auto read = ReadFile(path);
    if (!read.ok() && read.status().code() == StatusCode::kNotFound &&
        ::access((dir + "/tokenizer.model").c_str(), F_OK) == 0) {
      return FromSentencePiece(dir);
    }
    ASSIGN_OR_RETURN(std::string text, std::move(read));
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return InvalidArgumentError(path + ": not valid JSON");
    if (!j.is_object() || !j.contains("model"))
      return InvalidArgumentError(path + ": not a tokenizer.json");
    const std::string config_path = dir + "/tokenizer_config.json";
    auto config_text = ReadFile(config_path);
    // Absent is fine; one that cannot be opened (refused by the confinement, a FIFO) is named.
    if (!config_text.ok() && config_text.status().code() != StatusCode::kNotFound) {
      return config_text.status();
    }
    if (config_text.ok()) {
      json config = json::parse(*config_text, nullptr, false);
      if (config.is_discarded() || !config.is_object()) {
        return InvalidArgumentError(config_path + ": not a JSON object");
      }
      const std::string cls = config.value("tokenizer_class", "");
      if (cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast") {
        RETURN_IF_ERROR(ApplyLlamaTokenizerClass(config, &j, config_path));
      }
    }
    return FromParsed(j, path);
  });
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text,
                                                         std::string_view origin) {
  const std::string where(origin);
  json j = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgumentError(where + ": not valid JSON");
  return FromParsed(j, where);
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromParsed(const json& j,
                                                           const std::string& where) {
  return GuardJson(where, [&]() -> StatusOr<std::unique_ptr<Tokenizer>> {
    if (!j.is_object()) return InvalidArgumentError(where + ": top level is not a JSON object");
    auto wrap = [&](const Status& s) { return s.WithContext(where); };

    std::unique_ptr<Tokenizer> tok(new Tokenizer());
    auto model_it = j.find("model");  // by reference: the model holds the whole vocabulary
    if (model_it == j.end() || !model_it->is_object()) {
      return InvalidArgumentError(where + ": missing \"model\" object");
    }
    const json& model = *model_it;
    const std::string type = model.value("type", std::string());
    // Older files omit the type; a BPE model is recognised by its merges.
    if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
      return UnimplementedError(where + ": unsupported model type \"" + type +
                                "\" (only BPE is supported)");
    }
    auto bpe = BpeModel::FromJson(model);
    if (!bpe.ok()) return wrap(bpe.status());
    tok->model_ = std::move(*bpe);

    auto normalizer = MakeNormalizer(j.value("normalizer", json()), "normalizer");
    if (!normalizer.ok()) return wrap(normalizer.status());
    tok->normalizer_ = std::move(*normalizer);
    auto pre = MakePreTokenizer(j.value("pre_tokenizer", json()), "pre_tokenizer");
    if (!pre.ok()) return wrap(pre.status());
    tok->pre_tokenizer_ = std::move(*pre);
    auto decoder = MakeDecoder(j.value("decoder", json()), "decoder");
    if (!decoder.ok()) return wrap(decoder.status());
    tok->decoder_ = std::move(*decoder);
    auto post = MakePostProcessor(j.value("post_processor", json()), "post_processor");
    if (!post.ok()) return wrap(post.status());
    tok->post_processor_ = std::move(*post);
    if (j.contains("truncation") && !j["truncation"].is_null()) {
      return UnimplementedError(where +
                                ": \"truncation\" in tokenizer.json is not supported "
                                "(the dataset pipeline truncates)");
    }

    const json& added = j.value("added_tokens", json::array());
    if (!added.is_array()) return InvalidArgumentError(where + ": added_tokens is not an array");
    tok->vocab_size_ = tok->model_->max_id() + 1;
    for (size_t i = 0; i < added.size(); ++i) {
      const json& a = added[i];
      const std::string path = where + ": added_tokens[" + std::to_string(i) + "]";
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string() || a["id"].get<int64_t>() < 0 ||
          a["id"].get<int64_t>() > INT32_MAX) {
        return InvalidArgumentError(path + ": needs an integer \"id\" and a string \"content\"");
      }
      AddedToken t;
      t.id = a["id"].get<int32_t>();
      t.content = a["content"].get<std::string>();
      if (t.content.empty()) return InvalidArgumentError(path + ": empty content");
      t.single_word = a.value("single_word", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.normalized = a.value("normalized", true);
      t.special = a.value("special", false);
      tok->added_by_id_[t.id] = tok->added_tokens_.size();
      tok->vocab_size_ = std::max(tok->vocab_size_, t.id + 1);
      tok->added_tokens_.push_back(std::move(t));
    }
    RETURN_IF_ERROR(tok->BuildAddedTokenMatchers());
    return tok;
  });
}

Status Tokenizer::BuildAddedTokenMatchers() {
  std::vector<AddedTokenMatcher::Pattern> raw, normalized;
  for (const AddedToken& t : added_tokens_) {
    if (t.normalized && normalizer_) {
      AlignedText pattern = AlignedText::FromOriginal(t.content, 0, true);
      RETURN_IF_ERROR(normalizer_->Normalize(&pattern));
      normalized.push_back({std::move(pattern.text), &t});
    } else if (t.normalized) {
      normalized.push_back({t.content, &t});
    } else {
      raw.push_back({t.content, &t});
    }
  }
  raw_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  normalized_matcher_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));
  return OkStatus();
}

Status Tokenizer::EncodePieces(std::vector<AlignedText>* pieces, Encoding* out) const {
  if (pieces->empty()) return OkStatus();
  if (pre_tokenizer_) RETURN_IF_ERROR(pre_tokenizer_->PreTokenize(pieces));
  for (const auto& piece : *pieces) {
    const size_t first = out->starts.size();
    model_->Tokenize(piece.text, &out->ids, &out->starts);
    for (size_t i = first; i < out->starts.size(); ++i) {
      out->starts[i] = piece.orig.empty()
                           ? 0
                           : piece.orig[std::min<size_t>(out->starts[i], piece.orig.size() - 1)];
    }
  }
  pieces->clear();
  return OkStatus();
}

Status Tokenizer::EncodeSegment(std::string_view raw, uint32_t base, Encoding* out) const {
  // transformers' non-legacy Llama tokenizers prefix "▁" only where the text begins.
  if (spm_) return spm_->Encode(raw, spm_legacy_ || base == 0, base, out);
  AlignedText text = AlignedText::FromOriginal(raw, base, base == 0);
  if (normalizer_) RETURN_IF_ERROR(normalizer_->Normalize(&text));
  std::vector<AlignedText> pieces;
  for (const auto& p : normalized_matcher_->Split(text.text)) {
    if (p.token != nullptr) {
      // Encode the plain text gathered so far, then the token itself.
      RETURN_IF_ERROR(EncodePieces(&pieces, out));
      out->ids.push_back(p.token->id);
      out->starts.push_back(p.begin < text.orig.size() ? text.orig[p.begin] : base);
      continue;
    }
    if (p.end > p.begin) pieces.push_back(text.Slice(p.begin, p.end));
  }
  return EncodePieces(&pieces, out);
}

StatusOr<Encoding> Tokenizer::EncodeWithOffsets(std::string_view text,
                                                bool add_special_tokens) const {
  if (!IsValidUtf8(text)) return InvalidArgumentError("Encode: input is not valid UTF-8");
  if (text.size() > UINT32_MAX) return InvalidArgumentError("Encode: input larger than 4 GiB");
  Encoding out;
  out.ids.reserve(text.size() / 3 + 4);
  out.starts.reserve(text.size() / 3 + 4);
  for (const auto& p : raw_matcher_->Split(text)) {
    if (p.token != nullptr) {
      out.ids.push_back(p.token->id);
      out.starts.push_back(static_cast<uint32_t>(p.begin));
    } else if (p.end > p.begin) {
      RETURN_IF_ERROR(EncodeSegment(text.substr(p.begin, p.end - p.begin),
                                    static_cast<uint32_t>(p.begin), &out));
    }
  }
  if (add_special_tokens && post_processor_) {
    post_processor_->Process(&out.ids, &out.starts, static_cast<uint32_t>(text.size()));
  }
  return out;
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                 bool add_special_tokens) const {
  ASSIGN_OR_RETURN(Encoding e, EncodeWithOffsets(text, add_special_tokens));
  return std::move(e.ids);
}

StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                        bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    auto added = added_by_id_.find(id);
    if (added != added_by_id_.end()) {
      const AddedToken& t = added_tokens_[added->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(t.content);
      continue;
    }
    if (spm_) {
      if (auto t = spm_->Piece(id)) tokens.push_back(std::move(*t));
    } else if (const std::string* t = model_->IdToToken(id)) {
      tokens.push_back(*t);
    }
  }
  if (!decoder_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  RETURN_IF_ERROR(decoder_->DecodeChain(&tokens));
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  for (const AddedToken& t : added_tokens_) {
    if (t.content == token) return t.id;
  }
  if (spm_) return spm_->PieceToId(token);
  return model_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  auto added = added_by_id_.find(id);
  if (added != added_by_id_.end()) return added_tokens_[added->second].content;
  if (spm_) return spm_->Piece(id);
  if (const std::string* t = model_->IdToToken(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto added = added_by_id_.find(id);
  return added != added_by_id_.end() && added_tokens_[added->second].special;
}

}  // namespace offloadd::text
