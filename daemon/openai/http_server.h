#pragma once
// A small HTTP/1.1 server (Boost.Beast over Boost.Asio) for the daemon's REST APIs: it accepts on
// one TCP address, reads each request's header, authenticates it from its Authorization header
// before reading any body, bounds the body, and hands whole requests to a handler on a pool of
// worker threads (a handler may block: job validation takes seconds), so slow handlers never
// stall the connections' I/O.
//
// Limits: a request header of at most 16 KiB; a body of at most Options::max_body_bytes
// (413 before it is read, from Content-Length, or as soon as a chunked body passes it); a
// connection idle (or trickling) for Options::idle_timeout_seconds is closed; at most
// Options::max_connections at once (more are closed as they are accepted).
//
// Thread-safe. Shutdown (or the destructor) stops accepting, closes every connection and joins
// the threads; requests whose handler is running finish first.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"

namespace offloadd::daemon::openai {

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
    std::string listen;  // "host:port"; port 0 picks a free one (port())
    uint64_t max_body_bytes = 1 << 20;
    double idle_timeout_seconds = 60;
    int max_connections = 256;
    int handler_threads = 4;
    // The caller from the request's Authorization header ("" when it has none): the client's name,
    // or an error response (401) sent instead of reading the body.
    std::function<StatusOr<std::string>(const std::string& authorization)> authenticate;
    // The response to a request refused before its handler ran (401, 413, 400): the API's own
    // error shape.
    std::function<HttpResponse(int status, const std::string& message, const std::string& code)>
        error;
  };
  using Handler = std::function<HttpResponse(const HttpRequest&)>;

  // Binds and starts serving. INVALID_ARGUMENT for a malformed `listen`, UNAVAILABLE naming the
  // address when it cannot be bound.
  static StatusOr<std::unique_ptr<HttpServer>> Start(Options options, Handler handler);
  ~HttpServer();
  int port() const;
  void Shutdown();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::daemon::openai
