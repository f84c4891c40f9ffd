#pragma once
// The pipeline stages of a Hugging Face tokenizer.json besides the model: normalizers,
// pre-tokenizers, decoders and post-processors. Each Make* factory parses one JSON object and
// rejects unknown or unsupported component types by name, with the JSON path in the message
// (for example: `pre_tokenizer.pretokenizers[1]: unsupported pre-tokenizer type "Whitespace"`).
// All stages are immutable after construction and safe to share between threads.
//
// Supported:
//   normalizers     Sequence, Prepend, Replace (String or Regex), NFC, NFD, NFKC, NFKD, Strip,
//                   Lowercase
//   pre_tokenizers  Sequence, ByteLevel, Split (String or Regex; all five behaviours, invert),
//                   Metaspace (prepend_scheme always/first/never, split), Digits
//   decoders        Sequence, ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace
//   post_processors Sequence, TemplateProcessing, ByteLevel, BertProcessing, RobertaProcessing

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::text {

// Text flowing through normalization and pre-tokenization, aligned with the caller's input.
struct AlignedText {
  std::string text;
  // orig[i]: byte offset in the original input of the character that produced text[i].
  std::vector<uint32_t> orig;
  // True when the piece starts at offset 0 of the caller's input (Metaspace prepend_scheme
  // "first" prepends only there).
  bool at_start = false;

  static AlignedText FromOriginal(std::string_view s, uint32_t base, bool at_start);
  AlignedText Slice(size_t begin, size_t end) const;
};
using PreToken = AlignedText;

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual Status Normalize(AlignedText* t) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces *pieces by their sub-pieces (empty pieces are dropped).
  virtual Status PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Transforms the token strings in place (the `decode_chain` of `tokenizers`).
  virtual Status DecodeChain(std::vector<std::string>* tokens) const = 0;
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds special tokens around one encoded sequence; tokens placed before it get offset 0,
  // tokens after it `end_offset`.
  virtual void Process(std::vector<int32_t>* ids, std::vector<uint32_t>* offsets,
                       uint32_t end_offset) const = 0;
};

// `json` may be null: the factories then return nullptr (no stage).
StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& json,
                                                     const std::string& path);
StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const nlohmann::json& json,
                                                         const std::string& path);
StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const nlohmann::json& json, const std::string& path);
StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const nlohmann::json& json,
                                                           const std::string& path);

}  // namespace offloadd::text
