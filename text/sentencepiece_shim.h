#pragma once
// The C interface of liboffloadd_sentencepiece.so, the one object that links Debian's
// libsentencepiece. That library carries its own copy of protobuf-lite 3.14 and exports its
// symbols, which clash with the system libprotobuf (3.21) that gRPC and offloadd's own protos use:
// linked into one process in either order it aborts ("compiled against version 3.14.0") or
// crashes. sentencepiece_model.cc therefore dlopens this shim with RTLD_LOCAL | RTLD_DEEPBIND, so
// that the shim and libsentencepiece resolve their symbols among themselves first, and only plain
// C types cross the boundary. Buffers the shim returns are freed with offloadd_spm_release.

#include <stddef.h>
#include <stdint.h>

extern "C" {

typedef struct offloadd_spm offloadd_spm;

// Piece kinds, as SentencePiece's ModelProto types them.
enum {
  OFFLOADD_SPM_NORMAL = 1,
  OFFLOADD_SPM_UNKNOWN = 2,
  OFFLOADD_SPM_CONTROL = 3,
  OFFLOADD_SPM_USER_DEFINED = 4,
  OFFLOADD_SPM_UNUSED = 5,
  OFFLOADD_SPM_BYTE = 6
};

// Parses a serialized ModelProto (a tokenizer.model file's bytes). Null on failure, with the
// reason in err (NUL-terminated, truncated to err_cap).
offloadd_spm* offloadd_spm_load(const char* data, size_t size, char* err, size_t err_cap);
void offloadd_spm_free(offloadd_spm* model);
int32_t offloadd_spm_size(const offloadd_spm* model);
// The piece's text (valid while the model lives); null for an id out of range.
const char* offloadd_spm_piece(const offloadd_spm* model, int32_t id, size_t* len);
// The piece's id; -1 when it is not in the vocabulary.
int32_t offloadd_spm_piece_to_id(const offloadd_spm* model, const char* piece, size_t len);
int offloadd_spm_kind(const offloadd_spm* model, int32_t id);
// Encodes text: the ids and, for each, the byte offset in text where its surface begins.
// dummy_prefix = 0 encodes as if the model's add_dummy_prefix were false (the text after an added
// token in transformers' non-legacy Llama tokenizers). Returns the count (*ids, *begins are then
// malloc'd, to be released), or -1 with err set.
long offloadd_spm_encode(const offloadd_spm* model, int dummy_prefix, const char* text, size_t len,
                         int32_t** ids, uint32_t** begins, char* err, size_t err_cap);
void offloadd_spm_release(void* buffer);

}  // extern "C"
