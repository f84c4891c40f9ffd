// Tokenizer::FromSentencePiece: a model directory with a SentencePiece tokenizer.model and no
// tokenizer.json, encoded through libsentencepiece the way transformers' LlamaTokenizer[Fast]
// (converted from that file by its LlamaConverter) encodes (see tokenizer.h).
#include <nlohmann/json.hpp>

#include "common/safe_path.h"
#include "text/added_tokens.h"
#include "text/components.h"
#include "text/json_guard.h"
#include "text/sentencepiece_model.h"
#include "text/tokenizer.h"

namespace offloadd::text {

using json = nlohmann::json;

namespace {

std::string ConfigTokenText(const json& config, const char* key, const char* fallback) {
  auto it = config.find(key);
  if (it == config.end()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";  // null: no such token
}

}  // namespace

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSentencePiece(const std::string& dir) {
  const std::string path = dir + "/tokenizer.model";
  return GuardJson(path, [&]() -> StatusOr<std::unique_ptr<Tokenizer>> {
    StatusOr<std::string> bytes = ReadFileConfined(path);
    if (!bytes.ok()) return bytes.status().WithContext("tokenizer file");
    json config = json::object();
    const std::string config_path = dir + "/tokenizer_config.json";
    if (auto text = ReadFileConfined(config_path); text.ok()) {
      config = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (config.is_discarded() || !config.is_object()) {
        return InvalidArgumentError(config_path + ": not a JSON object");
      }
    } else if (text.status().code() != StatusCode::kNotFound) {
      return text.status();
    }
    for (const char* key : {"add_bos_token", "add_eos_token", "legacy"}) {
      if (config.contains(key) && !config[key].is_boolean() && !config[key].is_null()) {
        return InvalidArgumentError(config_path + ": " + key + " must be true or false");
      }
    }
    ASSIGN_OR_RETURN(auto spm, SentencePieceModel::Load(*bytes, path));

    std::unique_ptr<Tokenizer> tok(new Tokenizer());
    // transformers' LlamaTokenizer: legacy unless the config says false.
    tok->spm_legacy_ = !(config.contains("legacy") && config["legacy"].is_boolean() &&
                         !config["legacy"].get<bool>());
    tok->vocab_size_ = spm->size();
    // The control pieces (<s>, </s>, Mistral's [INST]...) are the converted tokenizer's special
    // added tokens: split out of the text as written, never normalized. (<unk> is not one: the
    // converter leaves it in the vocabulary, so "<unk>" in a text is encoded as characters.)
    for (int32_t id = 0; id < spm->size(); ++id) {
      if (spm->KindOf(id) != SentencePieceModel::Kind::kControl) continue;
      AddedToken t;
      t.id = id;
      t.content = spm->Piece(id).value_or("");
      if (t.content.empty()) continue;
      t.normalized = false;
      t.special = true;
      tok->added_by_id_[t.id] = tok->added_tokens_.size();
      tok->added_tokens_.push_back(std::move(t));
    }

    // The decoder and BOS/EOS post-processor that LlamaConverter / LlamaTokenizerFast install.
    constexpr const char* kMetaspace = "\xE2\x96\x81";  // U+2581
    const json decoder = {
        {"type", "Sequence"},
        {"decoders",
         json::array(
             {{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
    ASSIGN_OR_RETURN(tok->decoder_, MakeDecoder(decoder, "decoder"));
    json single = json::array(), specials = json::object();
    auto add = [&](const std::string& token) -> Status {
      auto id = spm->PieceToId(token);
      if (!id)
        return InvalidArgumentError(config_path + ": special token \"" + token + "\" is not in " +
                                    path);
      single.push_back({{"SpecialToken", {{"id", token}, {"type_id", 0}}}});
      specials[token] = {{"id", token}, {"ids", {*id}}, {"tokens", {token}}};
      return OkStatus();
    };
    const std::string bos = ConfigTokenText(config, "bos_token", "<s>");
    const std::string eos = ConfigTokenText(config, "eos_token", "</s>");
    if (config.value("add_bos_token", true) && !bos.empty()) RETURN_IF_ERROR(add(bos));
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (config.value("add_eos_token", false) && !eos.empty()) RETURN_IF_ERROR(add(eos));
    const json post = {{"type", "TemplateProcessing"},
                       {"single", single},
                       {"pair", single},
                       {"special_tokens", specials}};
    ASSIGN_OR_RETURN(tok->post_processor_, MakePostProcessor(post, "post_processor"));
    tok->spm_ = std::move(spm);
    RETURN_IF_ERROR(tok->BuildAddedTokenMatchers());
    return tok;
  });
}

}  // namespace offloadd::text
