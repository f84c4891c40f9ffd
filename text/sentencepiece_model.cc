#include "text/sentencepiece_model.h"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <type_traits>
#include <vector>

#include "text/sentencepiece_shim.h"
#include "text/tokenizer.h"

namespace offloadd::text {

struct SentencePieceModel::Api {
  decltype(&offloadd_spm_load) load = nullptr;
  decltype(&offloadd_spm_free) free = nullptr;
  decltype(&offloadd_spm_size) size = nullptr;
  decltype(&offloadd_spm_piece) piece = nullptr;
  decltype(&offloadd_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&offloadd_spm_kind) kind = nullptr;
  decltype(&offloadd_spm_encode) encode = nullptr;
  decltype(&offloadd_spm_release) release = nullptr;
};

namespace {

constexpr const char* kShimName = "liboffloadd_sentencepiece.so";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

// Where the shim may be: installed beside the LibTorch runtime (<prefix>/lib/offloadd, the
// programs being in <prefix>/bin), beside the program, or where this build tree made it.
std::vector<std::string> ShimCandidates() {
  std::vector<std::string> out;
  char exe[4096];
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    std::string dir(exe, static_cast<size_t>(n));
    dir.resize(dir.rfind('/'));
    out.push_back(dir + "/../lib/offloadd/" + kShimName);
    out.push_back(dir + "/" + kShimName);
  }
#ifdef OFFLOADD_SENTENCEPIECE_SHIM
  out.push_back(OFFLOADD_SENTENCEPIECE_SHIM);
#endif
  return out;
}

// Loaded once per process and never unloaded.
StatusOr<const SentencePieceModel::Api*> LoadApi() {
  static std::once_flag once;
  static SentencePieceModel::Api api;
  static Status status = OkStatus();
  std::call_once(once, [] {
#ifndef OFFLOADD_SENTENCEPIECE_SHIM
    status = FailedPreconditionError(
        "this offloadd was built without libsentencepiece, so tokenizer.model files cannot be "
        "read: install the Debian/Ubuntu package libsentencepiece-dev and rebuild, or give the "
        "model directory a tokenizer.json");
    return;
#else
    if (kSanitized) {
      status = FailedPreconditionError(
          "tokenizer.model files are not read in sanitizer builds (the libsentencepiece shim needs "
          "RTLD_DEEPBIND, which the sanitizer runtimes refuse)");
      return;
    }
    std::string tried;
    void* lib = nullptr;
    for (const std::string& path : ShimCandidates()) {
      if (::access(path.c_str(), R_OK) != 0) continue;
      lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (lib != nullptr) break;
      tried += std::string(tried.empty() ? "" : "; ") + dlerror();
    }
    if (lib == nullptr) {
      status = FailedPreconditionError(
          std::string("cannot load ") + kShimName + ", which reads tokenizer.model files" +
          (tried.empty() ? std::string(" (not installed beside offloadd)") : ": " + tried) +
          "; is the Debian/Ubuntu package libsentencepiece0 installed?");
      return;
    }
    auto sym = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(lib, name));
      return *fn != nullptr;
    };
    if (!sym(&api.load, "offloadd_spm_load") || !sym(&api.free, "offloadd_spm_free") ||
        !sym(&api.size, "offloadd_spm_size") || !sym(&api.piece, "offloadd_spm_piece") ||
        !sym(&api.piece_to_id, "offloadd_spm_piece_to_id") ||
        !sym(&api.kind, "offloadd_spm_kind") || !sym(&api.encode, "offloadd_spm_encode") ||
        !sym(&api.release, "offloadd_spm_release")) {
      status = FailedPreconditionError(std::string(kShimName) + " lacks a symbol: " + dlerror());
    }
#endif
  });
  if (!status.ok()) return status;
  return &api;
}

}  // namespace

StatusOr<std::unique_ptr<SentencePieceModel>> SentencePieceModel::Load(const std::string& bytes,
                                                                       const std::string& origin) {
  ASSIGN_OR_RETURN(const Api* api, LoadApi());
  char err[512] = {};
  void* handle = api->load(bytes.data(), bytes.size(), err, sizeof err);
  if (handle == nullptr) {
    return InvalidArgumentError(origin + ": not a SentencePiece model (" + err + ")");
  }
  std::unique_ptr<SentencePieceModel> m(new SentencePieceModel());
  m->api_ = api;
  m->handle_ = handle;
  m->size_ = api->size(static_cast<offloadd_spm*>(handle));
  if (m->size_ <= 0) return InvalidArgumentError(origin + ": a SentencePiece model without pieces");
  return m;
}

SentencePieceModel::~SentencePieceModel() {
  if (handle_ != nullptr) api_->free(static_cast<offloadd_spm*>(handle_));
}

std::optional<std::string> SentencePieceModel::Piece(int32_t id) const {
  size_t len = 0;
  const char* p = api_->piece(static_cast<offloadd_spm*>(handle_), id, &len);
  if (p == nullptr) return std::nullopt;
  return std::string(p, len);
}

std::optional<int32_t> SentencePieceModel::PieceToId(std::string_view piece) const {
  const int32_t id =
      api_->piece_to_id(static_cast<offloadd_spm*>(handle_), piece.data(), piece.size());
  if (id < 0) return std::nullopt;
  return id;
}

SentencePieceModel::Kind SentencePieceModel::KindOf(int32_t id) const {
  switch (api_->kind(static_cast<offloadd_spm*>(handle_), id)) {
    case OFFLOADD_SPM_UNKNOWN:
      return Kind::kUnknown;
    case OFFLOADD_SPM_CONTROL:
      return Kind::kControl;
    case OFFLOADD_SPM_UNUSED:
      return Kind::kUnused;
    case OFFLOADD_SPM_BYTE:
      return Kind::kByte;
    default:
      return Kind::kNormal;
  }
}

Status SentencePieceModel::Encode(std::string_view text, bool dummy_prefix, uint32_t base,
                                  Encoding* out) const {
  int32_t* ids = nullptr;
  uint32_t* begins = nullptr;
  char err[512] = {};
  const long n = api_->encode(static_cast<offloadd_spm*>(handle_), dummy_prefix ? 1 : 0,
                              text.data(), text.size(), &ids, &begins, err, sizeof err);
  if (n < 0) return InvalidArgumentError(std::string("SentencePiece encode: ") + err);
  out->ids.insert(out->ids.end(), ids, ids + n);
  for (long i = 0; i < n; ++i) out->starts.push_back(base + begins[i]);
  api_->release(ids);
  api_->release(begins);
  return OkStatus();
}

}  // namespace offloadd::text
