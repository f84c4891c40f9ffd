#pragma once
// Native loader and encoder for Hugging Face `tokenizer.json` files with a BPE model: byte-level
// BPE (GPT-2, Llama-3, Qwen2) and SentencePiece-style BPE with byte fallback (Llama-2, Mistral,
// Phi-3, in both the legacy Prepend/Replace-normalizer form and the Metaspace form). Encoding
// follows the Python `tokenizers` pipeline step by step so that ids are identical:
//   1. added tokens with normalized=false are split out of the raw text (leftmost-longest match,
//      honouring lstrip / rstrip / single_word);
//   2. every other segment is normalized, then added tokens with normalized=true are split out
//      of it (their patterns normalized the same way);
//   3. the pre-tokenizer splits the remaining text; 4. the BPE model encodes each piece;
//   5. with add_special_tokens, the post-processor adds BOS/EOS-style tokens.
// Unsupported components are rejected by name when loading. A Tokenizer is immutable after
// loading (apart from an internal, locked cache) and safe to use from many threads at once.

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace offloadd::text {

class BpeModel;
class Normalizer;
class PreTokenizer;
class Decoder;
class PostProcessor;
class AddedTokenMatcher;
class SentencePieceModel;

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// Token ids with, for each id, the byte offset in the input where the token's text begins
// (tokens that the post-processor adds before the text get 0, after it the input's length;
// characters expanded into several byte-fallback tokens share the character's offset).
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<uint32_t> starts;
};

class Tokenizer {
 public:
  // Loads a tokenizer.json. Errors name the file and the offending JSON path.
  static StatusOr<std::unique_ptr<Tokenizer>> FromFile(const std::string& path);
  // Loads DIR/tokenizer.json with DIR/tokenizer_config.json, encoding exactly like the Python
  // `tokenizers` library on that tokenizer.json (and like transformers 4's fast tokenizers).
  // For tokenizer_class LlamaTokenizer[Fast] the post-processor follows add_bos_token (default
  // true) / add_eos_token (default false); the file's normalizer and pre-tokenizer are kept, so
  // that e.g. Phi-3's Prepend("▁") normalizer applies to every segment between added tokens.
  // Only when the config sets add_prefix_space is the pipeline rebuilt from the vocab as
  // transformers does then: no normalizer, a Metaspace pre-tokenizer with prepend_scheme "first"
  // (legacy=false, the default), "always" (legacy=true) or "never" (add_prefix_space=false), and
  // the Replace/ByteFallback/Fuse[/Strip] decoder. (transformers 5's LlamaTokenizer always
  // rebuilds, which changes the token after each added token on such files: not followed.)
  // Other classes, or no tokenizer_config.json: the file as is (same as FromFile).
  // A directory without tokenizer.json but with a SentencePiece tokenizer.model (Mistral v0.3,
  // Llama 2, Gemma) is read through libsentencepiece, as transformers' LlamaTokenizer[Fast]
  // converted from it encodes: the model's control pieces are special tokens split out of the
  // text first; each other segment is encoded by SentencePiece, with its "▁" dummy prefix
  // on every segment when tokenizer_config.json's legacy is true (the default) and only on a
  // segment at the start of the text when it is false; BOS/EOS from add_bos_token (default true)
  // and add_eos_token; decoding through the converted Replace/ByteFallback/Fuse/Strip decoder.
  static StatusOr<std::unique_ptr<Tokenizer>> FromDirectory(const std::string& dir);
  // Parses tokenizer.json contents; `origin` names the source in error messages.
  static StatusOr<std::unique_ptr<Tokenizer>> FromJson(std::string_view json_text,
                                                       std::string_view origin = "tokenizer.json");
  ~Tokenizer();

  // Token ids for `text` (which must be valid UTF-8, else INVALID_ARGUMENT). With
  // add_special_tokens the post-processor's template is applied (e.g. Llama's leading <s>).
  StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens) const;
  // Same ids as Encode, with start offsets (used to align chat-template spans with tokens).
  StatusOr<Encoding> EncodeWithOffsets(std::string_view text, bool add_special_tokens) const;

  // Text for `ids` through the configured decoder; ids unknown to the vocabulary are skipped
  // (as `tokenizers` does); with skip_special_tokens, added tokens marked special are dropped.
  StatusOr<std::string> Decode(std::span<const int32_t> ids, bool skip_special_tokens) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // One past the largest id of the vocabulary or of an added token.
  int32_t vocab_size() const { return vocab_size_; }
  bool IsSpecial(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const { return added_tokens_; }

 private:
  Tokenizer();
  static StatusOr<std::unique_ptr<Tokenizer>> FromParsed(const nlohmann::json& j,
                                                         const std::string& where);
  static StatusOr<std::unique_ptr<Tokenizer>> FromSentencePiece(const std::string& dir);
  Status BuildAddedTokenMatchers();
  Status EncodeSegment(std::string_view text, uint32_t base, Encoding* out) const;
  Status EncodePieces(std::vector<struct AlignedText>* pieces, Encoding* out) const;

  std::unique_ptr<BpeModel> model_;         // tokenizer.json; null for a tokenizer.model
  std::unique_ptr<SentencePieceModel> spm_;  // tokenizer.model; null for a tokenizer.json
  bool spm_legacy_ = true;                   // every segment gets SentencePiece's "▁" prefix
  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<Decoder> decoder_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::vector<AddedToken> added_tokens_;
  std::unordered_map<int32_t, size_t> added_by_id_;
  std::unique_ptr<AddedTokenMatcher> raw_matcher_;         // normalized=false tokens
  std::unique_ptr<AddedTokenMatcher> normalized_matcher_;  // normalized=true tokens
  int32_t vocab_size_ = 0;
};

}  // namespace offloadd::text
