#pragma once
// Bearer-token authentication for the TCP listener: every call must carry
// "authorization: Bearer <token>" matching a token of the token file. The Unix socket relies on
// file permissions and SO_PEERCRED instead.
//
// The token file (mode 0600 or stricter) holds either
//   - one bare token: every holder is an operator, and clients are told apart by address only; or
//   - one client per line, "<name> <token> [operator] [user=<local user>]" (lines starting with '#'
//   are
//     comments): each holder is the client "token:<name>" for the per-client limits and as a job's
//     submitter, and may cancel, pause or resume only its own jobs unless the line says "operator".
//     With user=, a daemon running as root opens the client's job files with that local user's
//     rights (common/file_identity.h); without it, with the daemon's own.
// Only printable ASCII in token lines: a token travels in an HTTP/2 header.

#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::daemon {

struct ClientToken {
  std::string name;  // empty for the bare-token form
  std::string token;
  bool is_operator = true;
  std::string user;  // user=<local user> of the line, "" for none
  int line = 0;      // for messages
};

inline constexpr size_t kMinTokenChars = 16;
inline constexpr size_t kMaxTokenClientName = 64;

// Parses a token file's text. Errors name the line: a token shorter than 16 characters, a bad or
// repeated name, a repeated token, an unknown role, a bare token among named lines, no token.
StatusOr<std::vector<ClientToken>> ParseTokenFile(const std::string& text, const std::string& path);
// Reads and parses the file; errors if it is missing or readable by group/others, or a user= names
// no local user.
StatusOr<std::vector<ClientToken>> ReadTokenFile(const std::string& path);

std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokenAuthProcessor(std::vector<ClientToken> tokens);

// The named client a call authenticated as (set by the processor), if any.
struct TokenClient {
  std::string name;
  bool is_operator = false;
  std::string user;  // the line's user=, "" for none
};
std::optional<TokenClient> TokenClientOf(const grpc::AuthContext* context);

}  // namespace offloadd::daemon
