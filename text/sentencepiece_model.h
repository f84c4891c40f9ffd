#pragma once
// A SentencePiece model (tokenizer.model) read and run by libsentencepiece, through the shim
// liboffloadd_sentencepiece.so (sentencepiece_shim.h says why it is loaded apart). Immutable after
// Load; safe to use from many threads (SentencePieceProcessor's encode is const).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace offloadd::text {

struct Encoding;

class SentencePieceModel {
 public:
  enum class Kind { kNormal, kUnknown, kControl, kUnused, kByte };

  // Parses `bytes` (a ModelProto); `origin` names it in errors. FAILED_PRECONDITION naming
  // libsentencepiece-dev when offloadd was built without it or its shim cannot be loaded.
  static StatusOr<std::unique_ptr<SentencePieceModel>> Load(const std::string& bytes,
                                                            const std::string& origin);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  int32_t size() const { return size_; }
  // The piece of `id`; nullopt out of range.
  std::optional<std::string> Piece(int32_t id) const;
  std::optional<int32_t> PieceToId(std::string_view piece) const;
  Kind KindOf(int32_t id) const;
  // Appends the ids of `text` to out->ids and their starts (base + byte offset) to out->starts.
  // dummy_prefix false: as if the model did not prepend "▁" (add_dummy_prefix = false).
  Status Encode(std::string_view text, bool dummy_prefix, uint32_t base, Encoding* out) const;

  struct Api;  // the shim's entry points (sentencepiece_model.cc)

 private:
  SentencePieceModel() = default;
  const Api* api_ = nullptr;
  void* handle_ = nullptr;
  int32_t size_ = 0;
};

}  // namespace offloadd::text
