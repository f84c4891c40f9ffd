// liboffloadd_sentencepiece.so: see sentencepiece_shim.h for why this is a separate object.
#include "text/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

struct offloadd_spm {
  sentencepiece::SentencePieceProcessor with_prefix;
  sentencepiece::SentencePieceProcessor without_prefix;
};

namespace {

void SetError(char* err, size_t cap, const std::string& message) {
  if (err == nullptr || cap == 0) return;
  const size_t n = std::min(cap - 1, message.size());
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

offloadd_spm* offloadd_spm_load(const char* data, size_t size, char* err, size_t err_cap) {
  auto model = std::make_unique<offloadd_spm>();
  const std::string bytes(data, size);
  if (auto s = model->with_prefix.LoadFromSerializedProto(bytes); !s.ok()) {
    SetError(err, err_cap, s.ToString());
    return nullptr;
  }
  // The same model with normalizer_spec.add_dummy_prefix = false. Protobuf merges a repeated
  // occurrence of a singular message field into the first, so appending ModelProto field 3
  // (normalizer_spec, length-delimited: 0x1A) holding NormalizerSpec field 3 (add_dummy_prefix,
  // varint: 0x18) = 0 overrides that one setting and keeps the rest.
  static constexpr char kNoDummyPrefix[] = {0x1A, 0x02, 0x18, 0x00};
  if (auto s =
          model->without_prefix.LoadFromSerializedProto(bytes + std::string(kNoDummyPrefix, 4));
      !s.ok()) {
    SetError(err, err_cap, s.ToString());
    return nullptr;
  }
  return model.release();
}

void offloadd_spm_free(offloadd_spm* model) { delete model; }

int32_t offloadd_spm_size(const offloadd_spm* model) { return model->with_prefix.GetPieceSize(); }

const char* offloadd_spm_piece(const offloadd_spm* model, int32_t id, size_t* len) {
  if (id < 0 || id >= model->with_prefix.GetPieceSize()) return nullptr;
  const std::string& p = model->with_prefix.IdToPiece(id);
  *len = p.size();
  return p.data();
}

int32_t offloadd_spm_piece_to_id(const offloadd_spm* model, const char* piece, size_t len) {
  const std::string_view p(piece, len);
  const int id = model->with_prefix.PieceToId(p);
  // PieceToId answers unk_id for a piece it does not know.
  return model->with_prefix.IdToPiece(id) == p ? id : -1;
}

int offloadd_spm_kind(const offloadd_spm* model, int32_t id) {
  const auto& m = model->with_prefix;
  if (m.IsUnknown(id)) return OFFLOADD_SPM_UNKNOWN;
  if (m.IsControl(id)) return OFFLOADD_SPM_CONTROL;
  if (m.IsByte(id)) return OFFLOADD_SPM_BYTE;
  if (m.IsUnused(id)) return OFFLOADD_SPM_UNUSED;
  return OFFLOADD_SPM_NORMAL;  // user-defined pieces encode like normal ones here
}

long offloadd_spm_encode(const offloadd_spm* model, int dummy_prefix, const char* text, size_t len,
                         int32_t** ids, uint32_t** begins, char* err, size_t err_cap) {
  const auto& m = dummy_prefix ? model->with_prefix : model->without_prefix;
  sentencepiece::ImmutableSentencePieceText spt;
  if (auto s = m.Encode(std::string_view(text, len), spt.mutable_proto()); !s.ok()) {
    SetError(err, err_cap, s.ToString());
    return -1;
  }
  const size_t n = spt.pieces_size();
  *ids = static_cast<int32_t*>(std::malloc(std::max<size_t>(1, n) * sizeof(int32_t)));
  *begins = static_cast<uint32_t*>(std::malloc(std::max<size_t>(1, n) * sizeof(uint32_t)));
  if (*ids == nullptr || *begins == nullptr) {
    std::free(*ids);
    std::free(*begins);
    SetError(err, err_cap, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < n; ++i) {
    const auto piece = spt.pieces(static_cast<int>(i));
    (*ids)[i] = static_cast<int32_t>(piece.id());
    (*begins)[i] = piece.begin();
  }
  return static_cast<long>(n);
}

void offloadd_spm_release(void* buffer) { std::free(buffer); }

}  // extern "C"
