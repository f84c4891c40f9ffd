#include "daemon/server/token_auth.h"

#include <openssl/crypto.h>
#include <sys/stat.h>

#include <fstream>

namespace offloadd::daemon {
namespace {

class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::string token) : expected_("Bearer " + std::move(token)) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext*, OutputMetadata* consumed,
                       OutputMetadata*) override {
    const auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing 'authorization: Bearer <token>' metadata (required on TCP)");
    }
    const grpc::string_ref got = it->second;
    // Constant-time comparison so the token cannot be guessed byte by byte from timings.
    if (got.size() != expected_.size() || CRYPTO_memcmp(got.data(), expected_.data(), got.size()) != 0) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
    }
    consumed->insert({std::string(it->first.data(), it->first.size()), std::string(got.data(), got.size())});
    return grpc::Status::OK;
  }

 private:
  std::string expected_;
};

}  // namespace

StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) return ErrnoError(errno, "server.tcp.auth_token_file " + path);
  if ((st.st_mode & 077) != 0) {
    return PermissionDeniedError("server.tcp.auth_token_file " + path +
                                 " is readable by group or others; chmod 600 it");
  }
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  const auto b = token.find_first_not_of(" \t\r");
  const auto e = token.find_last_not_of(" \t\r");
  token = b == std::string::npos ? "" : token.substr(b, e - b + 1);
  if (token.size() < 16) {
    return InvalidArgumentError("server.tcp.auth_token_file " + path + " must hold a token of at least 16 characters");
  }
  return token;
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokenAuthProcessor(std::string token) {
  return std::make_shared<TokenAuthProcessor>(std::move(token));
}

}  // namespace offloadd::daemon
