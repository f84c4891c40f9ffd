#include "daemon/server/token_auth.h"

#include <openssl/crypto.h>
#include <sys/stat.h>

#include <fstream>
#include <set>
#include <sstream>

#include "common/file_identity.h"

namespace offloadd::daemon {
namespace {

constexpr char kClientProperty[] = "offloadd.token_client";
constexpr char kRoleProperty[] = "offloadd.token_role";
constexpr char kUserProperty[] = "offloadd.token_user";

class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(std::vector<ClientToken> tokens) {
    for (ClientToken& t : tokens) {
      t.token = "Bearer " + t.token;
      expected_.push_back(std::move(t));
    }
  }

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& auth_metadata, grpc::AuthContext* context, OutputMetadata* consumed,
                       OutputMetadata*) override {
    const auto it = auth_metadata.find("authorization");
    if (it == auth_metadata.end()) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "missing 'authorization: Bearer <token>' metadata (required on TCP)");
    }
    const grpc::string_ref got = it->second;
    // Constant-time comparison against every token, with no early exit, so neither a token's bytes
    // nor which client's token was close can be learned from timings (only the lengths).
    const ClientToken* match = nullptr;
    for (const ClientToken& t : expected_) {
      const bool same = got.size() == t.token.size() && CRYPTO_memcmp(got.data(), t.token.data(), got.size()) == 0;
      if (same) match = &t;
    }
    if (match == nullptr) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid bearer token");
    if (!match->name.empty() && context != nullptr) {
      context->AddProperty(kClientProperty, match->name);
      context->AddProperty(kRoleProperty, match->is_operator ? "operator" : "client");
      if (!match->user.empty()) context->AddProperty(kUserProperty, match->user);
    }
    consumed->insert({std::string(it->first.data(), it->first.size()), std::string(got.data(), got.size())});
    return grpc::Status::OK;
  }

 private:
  std::vector<ClientToken> expected_;
};

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > kMaxTokenClientName) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-' || c == '@';
    if (!ok) return false;
  }
  return true;
}

// A token travels in an HTTP/2 header ("authorization: Bearer <token>"), where only printable
// ASCII survives: a byte order mark, a NUL, a control character or a non-ASCII byte in a token line
// would make a file that passes --validate-config and that no client can authenticate with (issue
// #29 item 15). Names the line and column, never the bytes around them (they may be the token).
Status CheckLineBytes(const std::string& line, int n, bool comment, const std::string& where) {
  if (n == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) {
    return InvalidArgumentError(where +
                                "starts with a UTF-8 byte order mark; save the file as plain "
                                "ASCII without it");
  }
  for (size_t i = 0; i < line.size(); ++i) {
    const auto c = static_cast<unsigned char>(line[i]);
    const auto col = [&] { return "column " + std::to_string(i + 1) + ": "; };
    if (c == 0)
      return InvalidArgumentError(where + col() + "a NUL byte; the file must be plain text");
    if (comment) continue;                            // anything printable in a comment
    if (c == '\r' && i + 1 == line.size()) continue;  // a CRLF line end
    if (c >= 0x80) {
      return InvalidArgumentError(where + col() +
                                  "a non-ASCII byte; names and tokens are printable "
                                  "ASCII (a token travels in an HTTP/2 header)");
    }
    if ((c < 0x20 && c != '\t') || c == 0x7f) {
      return InvalidArgumentError(where + col() +
                                  "a control character; names and tokens are printable "
                                  "ASCII (a token travels in an HTTP/2 header)");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<ClientToken>> ParseTokenFile(const std::string& text, const std::string& path) {
  std::vector<ClientToken> out;
  std::set<std::string> names, tokens;
  bool bare = false;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    const std::string where = "server.tcp.auth_token_file " + path + ":" + std::to_string(n) + ": ";
    const auto first = line.find_first_not_of(" \t\r");
    const bool comment = first != std::string::npos && line[first] == '#';
    RETURN_IF_ERROR(CheckLineBytes(line, n, comment, where));
    if (comment) continue;  // a comment line ('#' inside a token is part of it)
    std::istringstream words(line);
    std::vector<std::string> w;
    for (std::string word; words >> word;) w.push_back(word);
    if (w.empty()) continue;
    if (w.size() > 4) {
      return InvalidArgumentError(
          where +
          "expected '<name> <token> [operator] [user=<local user>]' or one bare "
          "token, got " +
          std::to_string(w.size()) + " words");
    }
    ClientToken t;
    if (w.size() == 1) {
      t.token = w[0];
      bare = true;
    } else {
      t.name = w[0];
      t.token = w[1];
      t.is_operator = false;
      t.line = n;
      if (!ValidName(t.name)) {
        return InvalidArgumentError(where + "client name must be 1.." + std::to_string(kMaxTokenClientName) +
                                    " of [A-Za-z0-9._@-]");
      }
      for (size_t i = 2; i < w.size(); ++i) {
        if (i == 2 && w[i] == "operator") {
          t.is_operator = true;
        } else if (w[i].rfind("user=", 0) == 0 && t.user.empty()) {
          // The local user whose rights the client's jobs get (common/file_identity.h).
          t.user = w[i].substr(5);
          if (!ValidName(t.user) || t.user.size() > 32) {
            return InvalidArgumentError(where +
                                        "user= must name a local user (1..32 of [A-Za-z0-9._@-])");
          }
        } else if (i == 2) {
          // Not echoed: a misordered line may hold the token there.
          return InvalidArgumentError(
              where +
              "the third word must be the role 'operator' (the only role) or "
              "user=<local user>");
        } else {
          return InvalidArgumentError(where +
                                      "expected '<name> <token> [operator] [user=<local user>]'");
        }
      }
      if (!names.insert(t.name).second) return InvalidArgumentError(where + "client '" + t.name + "' is named twice");
    }
    if (t.token.size() < kMinTokenChars) {
      return InvalidArgumentError(where + "a token must have at least " + std::to_string(kMinTokenChars) +
                                  " characters");
    }
    if (!tokens.insert(t.token).second) {
      return InvalidArgumentError(where + "this token is already given to another client");
    }
    out.push_back(std::move(t));
  }
  if (out.empty()) {
    return InvalidArgumentError("server.tcp.auth_token_file " + path + " must hold a token of at least " +
                                std::to_string(kMinTokenChars) + " characters");
  }
  if (bare && out.size() > 1) {
    return InvalidArgumentError("server.tcp.auth_token_file " + path +
                                ": a bare token cannot stand beside other lines; name every client "
                                "('<name> <token> [operator]')");
  }
  return out;
}

StatusOr<std::vector<ClientToken>> ReadTokenFile(const std::string& path) {
  struct stat st{};
  if (stat(path.c_str(), &st) != 0) return ErrnoError(errno, "server.tcp.auth_token_file " + path);
  if (!S_ISREG(st.st_mode)) return InvalidArgumentError("server.tcp.auth_token_file " + path + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    return PermissionDeniedError("server.tcp.auth_token_file " + path +
                                 " is readable by group or others; chmod 600 it");
  }
  constexpr off_t kMaxBytes = 1 << 20;
  if (st.st_size > kMaxBytes) {
    return InvalidArgumentError("server.tcp.auth_token_file " + path + " is larger than 1 MiB");
  }
  std::ifstream in(path);
  if (!in) return ErrnoError(errno, "server.tcp.auth_token_file " + path);
  std::stringstream text;
  text << in.rdbuf();
  ASSIGN_OR_RETURN(std::vector<ClientToken> tokens, ParseTokenFile(text.str(), path));
  for (const ClientToken& t : tokens) {
    if (t.user.empty()) continue;
    if (auto id = IdentityOfUser(t.user); !id.ok()) {
      return InvalidArgumentError("server.tcp.auth_token_file " + path + ":" +
                                  std::to_string(t.line) + ": user=" + t.user + ": " +
                                  std::string(id.status().message()));
    }
  }
  return tokens;
}

std::shared_ptr<grpc::AuthMetadataProcessor> MakeTokenAuthProcessor(std::vector<ClientToken> tokens) {
  return std::make_shared<TokenAuthProcessor>(std::move(tokens));
}

std::optional<TokenClient> TokenClientOf(const grpc::AuthContext* context) {
  if (context == nullptr) return std::nullopt;
  const auto names = context->FindPropertyValues(kClientProperty);
  if (names.empty()) return std::nullopt;
  const auto roles = context->FindPropertyValues(kRoleProperty);
  TokenClient c;
  c.name.assign(names.front().data(), names.front().size());
  c.is_operator = !roles.empty() && std::string_view(roles.front().data(), roles.front().size()) == "operator";
  if (const auto users = context->FindPropertyValues(kUserProperty); !users.empty()) {
    c.user.assign(users.front().data(), users.front().size());
  }
  return c;
}

}  // namespace offloadd::daemon
