#pragma once
// A small HTTP/1.1 server (Boost.Beast over Boost.Asio) for the daemon's REST APIs: it accepts on
// one TCP address (plain, or TLS through OpenSSL) or one Unix socket, reads each request's header,
// authenticates it from its Authorization header and its peer before reading any body, bounds the
// body, and hands whole requests to a handler on a pool of worker threads (a handler may block:
// job validation takes seconds), so slow handlers never stall the connections' I/O.
//
// Limits, the same on every transport: a request header of at most 16 KiB; a body of at most
// Options::max_body_bytes (413 before it is read, from Content-Length, or as soon as a chunked
// body passes it); a connection idle (or trickling, or stalled in its TLS handshake) for
// Options::idle_timeout_seconds is closed; at most Options::max_connections at once (more are
// closed as they are accepted).
//
// TLS: a client that speaks plain HTTP to a TLS listener gets a 400 in plain HTTP saying so, and
// the connection is closed; nothing else is read from it.
//
// Thread-safe. Shutdown (or the destructor) stops accepting, closes every connection and joins
// the threads; requests whose handler is running finish first.

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"

namespace offloadd::daemon::openai {

// Who is on the other end of a connection, as the kernel says.
struct HttpPeer {
  bool unix_socket = false;  // a Unix socket connection: the fields below are its SO_PEERCRED
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // path and query, as sent ("/v1/files?limit=2")
  std::string content_type;
  std::string client;  // who Authenticate said the caller is
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string body;  // JSON
  std::string content_type = "application/json";
};

class HttpServer {
 public:
  struct Options {
    // "host:port" (port 0 picks a free one: port()), or "unix:/path": the socket is bound where
    // nobody can reach it, given unix_socket_mode, then renamed onto the path (a stale socket there
    // is replaced, a live one refused: server/unix_socket.h); Shutdown removes it.
    std::string listen;
    unsigned unix_socket_mode = 0660;
    // TLS on a TCP listen when both are set: PEM files, the certificate chain and its key.
    std::string tls_cert_file;
    std::string tls_key_file;
    // Prefixes the settings named in errors ("server.openai_api.": "...tls_cert_file /x: ...").
    std::string setting_prefix;
    uint64_t max_body_bytes = 1 << 20;
    double idle_timeout_seconds = 60;
    int max_connections = 256;
    int handler_threads = 4;
    // The caller from the request's Authorization header ("" when it has none) and its peer: the
    // client's name, or an error response (401) sent instead of reading the body.
    std::function<StatusOr<std::string>(const std::string& authorization, const HttpPeer& peer)>
        authenticate;
    // The response to a request refused before its handler ran (401, 413, 400): the API's own
    // error shape.
    std::function<HttpResponse(int status, const std::string& message, const std::string& code)>
        error;
  };
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds and starts serving. INVALID_ARGUMENT for a malformed `listen` or a TLS certificate or
  // key that cannot be used (naming tls_cert_file or tls_key_file), UNAVAILABLE naming the address
  // when it cannot be bound, FAILED_PRECONDITION when a live server owns the Unix socket.
  static StatusOr<std::unique_ptr<HttpServer>> Start(Options options, Handler handler);
  ~HttpServer();
  int port() const;  // 0 on a Unix socket
  void Shutdown();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Loads tls_cert_file and tls_key_file as Start would, without serving: the certificate chain and
// the key parse, and the key is the certificate's. Errors name the setting and the file.
Status CheckTlsFiles(const std::string& tls_cert_file, const std::string& tls_key_file,
                     const std::string& setting_prefix);

}  // namespace offloadd::daemon::openai
