#include "daemon/openai/http_server.h"

// GCC 12 takes Asio's awaitable frames, allocated by its own operator new and freed by the
// matching operator delete, for a mismatch (a known false positive of -Wmismatched-new-delete
// with coroutine frames).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
// Boost 1.74's Asio sees clang's C++20 coroutines only through libc++'s <experimental/coroutine>;
// with libstdc++ (the fuzz build compiles this file with clang) it must be told.
#if defined(__clang__) && defined(__cpp_impl_coroutine) && !defined(BOOST_ASIO_HAS_CO_AWAIT)
#define BOOST_ASIO_HAS_CO_AWAIT 1
#endif

#include <openssl/err.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detect_ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <type_traits>
#include <vector>

#include "common/logging.h"
#include "daemon/server/unix_socket.h"

namespace offloadd::daemon::openai {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ssl = asio::ssl;
using asio::ip::tcp;
using unix_socket = asio::local::stream_protocol;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using UnixStream = beast::basic_stream<unix_socket>;

constexpr const char* kLog = "openai-api";
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;
constexpr const char* kUnixPrefix = "unix:";

// The operator's own files (not a job's: no allowed_roots), read whole.
StatusOr<std::string> ReadSettingFile(const std::string& path, const std::string& setting) {
  if (path.empty()) return InvalidArgumentError(setting + ": not set");
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError(errno, setting + " " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A server context holding the certificate chain and key: TLS 1.2 and later only.
StatusOr<std::unique_ptr<ssl::context>> MakeTlsContext(const std::string& cert_file,
                                                       const std::string& key_file,
                                                       const std::string& prefix) {
  const std::string cert_setting = prefix + "tls_cert_file";
  const std::string key_setting = prefix + "tls_key_file";
  ASSIGN_OR_RETURN(std::string cert, ReadSettingFile(cert_file, cert_setting));
  ASSIGN_OR_RETURN(std::string key, ReadSettingFile(key_file, key_setting));
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                   ssl::context::single_dh_use);
  // A key with a passphrase would make OpenSSL prompt on the daemon's terminal: refuse it instead.
  ctx->set_password_callback(
      [](std::size_t, ssl::context::password_purpose) { return std::string(); });
  boost::system::error_code ec;
  ctx->use_certificate_chain(asio::buffer(cert), ec);
  if (ec) {
    return InvalidArgumentError(cert_setting + " " + cert_file +
                                ": not a PEM certificate chain (OpenSSL: " + ec.message() + ")");
  }
  ctx->use_private_key(asio::buffer(key), ssl::context::pem, ec);
  // OpenSSL checks the key against the certificate as it loads it.
  if ((ec && ec.category() == asio::error::get_ssl_category() &&
       ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH) ||
      (!ec && SSL_CTX_check_private_key(ctx->native_handle()) != 1)) {
    return InvalidArgumentError(key_setting + " " + key_file + " is not the key of " +
                                cert_setting + " " + cert_file);
  }
  if (ec) {
    return InvalidArgumentError(key_setting + " " + key_file +
                                ": not an unencrypted PEM private key (OpenSSL: " + ec.message() +
                                ")");
  }
  return ctx;
}

StatusOr<tcp::endpoint> ResolveListen(asio::io_context& io, const std::string& listen) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos)
    return InvalidArgumentError("expected host:port, got '" + listen + "'");
  std::string host = listen.substr(0, colon);
  const std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  tcp::resolver resolver(io);
  auto results = resolver.resolve(host, port, tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return InvalidArgumentError("cannot resolve '" + listen + "': " + ec.message());
  }
  return results.begin()->endpoint();
}

}  // namespace

struct HttpServer::Impl {
  // What the connections' coroutines use comes first: the io_context destroys the frames of the
  // connections still open when it is destroyed, and they touch these on the way.
  Options options;
  Handler handler;
  std::atomic<int> connections{0};
  std::atomic<bool> stopping{false};
  int port = 0;
  std::unique_ptr<ssl::context> tls;  // set: the TCP listener speaks TLS
  std::string unix_path;              // set: the Unix socket this server published
  asio::io_context io;
  tcp::acceptor tcp_acceptor{io};
  unix_socket::acceptor unix_acceptor{io};
  asio::thread_pool pool;
  std::vector<std::thread> io_threads;

  Impl(Options o, Handler h)
      : options(std::move(o)),
        handler(std::move(h)),
        pool(static_cast<size_t>(options.handler_threads)) {}

  http::response<http::string_body> ToBeast(const HttpResponse& r, unsigned version,
                                            bool keep_alive) {
    http::response<http::string_body> res{static_cast<http::status>(r.status), version};
    res.set(http::field::server, "offloadd");
    res.set(http::field::content_type, r.content_type);
    res.keep_alive(keep_alive && !stopping.load());
    res.body() = r.body;
    res.prepare_payload();
    return res;
  }

  template <class Stream>
  asio::awaitable<void> Send(Stream& stream, const HttpResponse& r, unsigned version,
                             bool keep_alive) {
    auto res = ToBeast(r, version, keep_alive);
    boost::system::error_code ec;
    beast::get_lowest_layer(stream).expires_after(Timeout());
    co_await http::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
  }

  std::chrono::steady_clock::duration Timeout() const {
    return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(options.idle_timeout_seconds));
  }

  static HttpRequest TakeRequest(http::request_parser<http::string_body>& parser,
                                 const std::string& client) {
    HttpRequest request;
    request.method = std::string(parser.get().method_string());
    request.target = std::string(parser.get().target());
    request.content_type = std::string(parser.get()[http::field::content_type]);
    request.client = client;
    request.body = std::move(parser.get().body());
    return request;
  }

  HttpResponse Handle(const HttpRequest& request) {
    try {
      return handler(request);
    } catch (const std::exception& e) {
      OFFLOADD_LOG(kError, kLog) << request.method << " " << request.target << ": " << e.what();
      return options.error(500, std::string("internal error: ") + e.what(), "internal_error");
    }
  }

  struct Count {
    std::atomic<int>& n;
    ~Count() { --n; }
  };

  // A TCP connection: TLS first when the listener has it, then its requests.
  asio::awaitable<void> ServeTcp(tcp::socket socket) {
    Count count{connections};
    if (!tls) {
      beast::tcp_stream stream(std::move(socket));
      beast::flat_buffer buffer;
      co_await Serve(stream, HttpPeer{}, buffer);
      co_return;
    }
    TlsStream stream(std::move(socket), *tls);
    beast::flat_buffer buffer;
    boost::system::error_code ec;
    beast::get_lowest_layer(stream).expires_after(Timeout());
    // A TLS connection starts with a handshake record; anything else is plain HTTP (http:// to an
    // https:// port), answered in kind so that the client's error says what is wrong.
    const bool speaks_tls = co_await beast::async_detect_ssl(
        beast::get_lowest_layer(stream), buffer, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return;
    if (!speaks_tls) {
      HttpResponse refusal =
          options.error(400, "this address serves HTTPS only: use https://", "tls_required");
      auto& plain = beast::get_lowest_layer(stream);
      co_await Send(plain, refusal, 11, false);
      // Closing with the request's body unread would reset the connection, and the client could
      // lose the answer: say goodbye, then drain what it still sends (at most 1 MiB, 2 s).
      plain.socket().shutdown(tcp::socket::shutdown_send, ec);
      plain.expires_after(std::chrono::seconds(2));
      char sink[4096];
      for (size_t drained = 0; drained < (1u << 20);) {
        const size_t n = co_await plain.async_read_some(
            asio::buffer(sink), asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        drained += n;
      }
      co_return;
    }
    const size_t used = co_await stream.async_handshake(
        ssl::stream_base::server, buffer.data(), asio::redirect_error(asio::use_awaitable, ec));
    if (ec) {
      OFFLOADD_LOG(kDebug, kLog) << "TLS handshake: " << ec.message();
      co_return;
    }
    buffer.consume(used);
    co_await Serve(stream, HttpPeer{}, buffer);
    beast::get_lowest_layer(stream).expires_after(std::chrono::seconds(5));
    co_await stream.async_shutdown(asio::redirect_error(asio::use_awaitable, ec));
  }

  // A Unix socket connection: its peer is the process that connected (SO_PEERCRED, fixed by the
  // kernel at connect).
  asio::awaitable<void> ServeUnix(unix_socket::socket socket) {
    Count count{connections};
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(socket.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      OFFLOADD_LOG(kWarning, kLog)
          << "Unix socket: SO_PEERCRED: " << std::strerror(errno) << "; connection closed";
      co_return;
    }
    HttpPeer peer;
    peer.unix_socket = true;
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
    UnixStream stream(std::move(socket));
    beast::flat_buffer buffer;
    co_await Serve(stream, peer, buffer);
  }

  // One connection: requests in turn (HTTP/1.1 keep-alive) until the client closes, a timeout, an
  // error response that ends it, or shutdown.
  //
  // No temporary with a destructor appears in a co_await expression here: GCC 12 destroys some of
  // them twice (a double free, seen in HttpServerTest); responses are named locals instead.
  template <class Stream>
  asio::awaitable<void> Serve(Stream& stream, HttpPeer peer, beast::flat_buffer& buffer) {
    while (!stopping.load()) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(kMaxHeaderBytes);
      // No body limit while the header is read: Beast would refuse a large Content-Length there,
      // before the caller is authenticated. It is set once the caller is known. (Not boost::none:
      // Beast 1.74 compares a length with an empty limit as greater, refusing every body.)
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      boost::system::error_code ec;
      beast::get_lowest_layer(stream).expires_after(Timeout());
      co_await http::async_read_header(stream, buffer, parser,
                                       asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
          ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == asio::error::operation_aborted || ec == ssl::error::stream_truncated) {
        break;
      }
      HttpResponse response;
      unsigned version = 11;
      bool keep_alive = false;
      if (ec == http::error::header_limit) {  // say what is wrong, then close
        response = options.error(431, "request header larger than 16 KiB", "header_too_large");
      } else if (ec) {
        response = options.error(400, "malformed HTTP request: " + ec.message(), "bad_request");
      } else {
        version = parser.get().version();
        std::string client;
        if (co_await Refused(stream, buffer, parser, peer, &client, &response)) {
          if (response.status == 0) break;  // the connection failed: nothing to answer
        } else {
          keep_alive = parser.get().keep_alive();
          HttpRequest request = TakeRequest(parser, client);
          // The handler may block (validation): it runs on the pool, and this coroutine resumes
          // on the connection's executor once it returns.
          auto work = [this, &request, &response]() -> asio::awaitable<void> {
            response = Handle(request);
            co_return;
          };
          co_await asio::co_spawn(pool, std::move(work), asio::use_awaitable);
        }
      }
      co_await Send(stream, response, version, keep_alive);
      if (!keep_alive) break;
    }
    if constexpr (!std::is_same_v<Stream, TlsStream>) {  // TLS says goodbye first (ServeTcp)
      boost::system::error_code ignored;
      beast::get_lowest_layer(stream).socket().shutdown(asio::socket_base::shutdown_both, ignored);
    }
  }

  // After the header: authenticates, bounds and reads the body. True with `*refusal` set when the
  // request is answered without its handler (its status 0 when the connection failed).
  template <class Stream>
  asio::awaitable<bool> Refused(Stream& stream, beast::flat_buffer& buffer,
                                http::request_parser<http::string_body>& parser, HttpPeer peer,
                                std::string* client_out, HttpResponse* refusal) {
    const auto& header = parser.get();
    auto client = options.authenticate(std::string(header[http::field::authorization]), peer);
    if (!client.ok()) {
      *refusal = options.error(401, client.status().message(), "invalid_api_key");
      co_return true;
    }
    *client_out = *client;
    if (parser.content_length() && *parser.content_length() > options.max_body_bytes) {
      *refusal = options.error(413,
                               "request body of " + std::to_string(*parser.content_length()) +
                                   " bytes is larger than the limit of " +
                                   std::to_string(options.max_body_bytes) + " bytes",
                               "request_too_large");
      co_return true;
    }
    boost::system::error_code ec;
    if (beast::iequals(header[http::field::expect], "100-continue")) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      co_await asio::async_write(stream, asio::buffer(kContinue, sizeof kContinue - 1),
                                 asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        refusal->status = 0;
        co_return true;
      }
    }
    parser.body_limit(options.max_body_bytes);  // a chunked body is refused once it passes it
    beast::get_lowest_layer(stream).expires_after(Timeout());
    co_await http::async_read(stream, buffer, parser,
                              asio::redirect_error(asio::use_awaitable, ec));
    if (ec == http::error::body_limit) {
      *refusal = options.error(413,
                               "request body larger than the limit of " +
                                   std::to_string(options.max_body_bytes) + " bytes",
                               "request_too_large");
      co_return true;
    }
    if (ec) {
      refusal->status = 0;
      co_return true;
    }
    co_return false;
  }

  // Whether an accepted connection may be served: false (it closes as it goes out of scope) when
  // the server stops, accept failed, or max_connections are open already.
  bool Admit(const boost::system::error_code& ec) {
    if (ec == asio::error::operation_aborted || stopping.load()) return false;
    if (ec) {
      OFFLOADD_LOG(kWarning, kLog) << "accept: " << ec.message();
      return false;
    }
    if (connections.load() >= options.max_connections) {
      OFFLOADD_LOG(kWarning, kLog)
          << "connection refused: " << options.max_connections << " connections open already";
      return false;
    }
    ++connections;
    return true;
  }

  asio::awaitable<void> AcceptTcp() {
    while (tcp_acceptor.is_open()) {
      boost::system::error_code ec;
      tcp::socket socket =
          co_await tcp_acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (Admit(ec)) asio::co_spawn(io, ServeTcp(std::move(socket)), asio::detached);
      if (stopping.load()) co_return;
    }
  }

  asio::awaitable<void> AcceptUnix() {
    while (unix_acceptor.is_open()) {
      boost::system::error_code ec;
      unix_socket::socket socket =
          co_await unix_acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (Admit(ec)) asio::co_spawn(io, ServeUnix(std::move(socket)), asio::detached);
      if (stopping.load()) co_return;
    }
  }

  Status ListenTcp() {
    ASSIGN_OR_RETURN(tcp::endpoint endpoint, ResolveListen(io, options.listen));
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      ASSIGN_OR_RETURN(
          tls, MakeTlsContext(options.tls_cert_file, options.tls_key_file, options.setting_prefix));
    }
    boost::system::error_code ec;
    tcp_acceptor.open(endpoint.protocol(), ec);
    if (!ec) tcp_acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) tcp_acceptor.bind(endpoint, ec);
    if (!ec) tcp_acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return UnavailableError("cannot listen on " + options.listen + ": " + ec.message());
    port = tcp_acceptor.local_endpoint().port();
    asio::co_spawn(io, AcceptTcp(), asio::detached);
    return OkStatus();
  }

  // Bound in a private directory, given its mode and only then renamed onto its path, as the gRPC
  // socket is (server/unix_socket.h): nobody connects while it has the umask's mode.
  Status ListenUnix() {
    if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
      return InvalidArgumentError(options.setting_prefix +
                                  "tls_cert_file: TLS is for a TCP listen, not " + options.listen);
    }
    const std::string path = options.listen.substr(std::strlen(kUnixPrefix));
    if (path.empty() || path.front() != '/') {
      return InvalidArgumentError("a Unix socket's path must be absolute, got '" + options.listen +
                                  "'");
    }
    const std::string setting = options.setting_prefix + "listen";
    RETURN_IF_ERROR(PrepareUnixSocketPath(path, setting));
    ASSIGN_OR_RETURN(auto binding, PrivateSocketBinding::Create(path, setting));
    boost::system::error_code ec;
    const unix_socket::endpoint endpoint(binding->bind_path());
    unix_acceptor.open(endpoint.protocol(), ec);
    if (!ec) unix_acceptor.bind(endpoint, ec);
    if (!ec) unix_acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return UnavailableError("cannot listen on " + options.listen + ": " + ec.message());
    RETURN_IF_ERROR(binding->Publish(options.unix_socket_mode));
    unix_path = path;
    asio::co_spawn(io, AcceptUnix(), asio::detached);
    return OkStatus();
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Options options, Handler handler) {
  if (!options.authenticate || !options.error || !handler) {
    return InvalidArgumentError("HttpServer needs authenticate, error and a handler");
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));
  const bool unix = impl->options.listen.rfind(kUnixPrefix, 0) == 0;
  RETURN_IF_ERROR(unix ? impl->ListenUnix() : impl->ListenTcp());
  for (int i = 0; i < 2; ++i) {
    impl->io_threads.emplace_back([io = &impl->io] { io->run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::~HttpServer() { Shutdown(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::Shutdown() {
  if (impl_->stopping.exchange(true)) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ignored;
    impl->tcp_acceptor.close(ignored);
    impl->unix_acceptor.close(ignored);
  });
  // Handlers that are running finish; then the connections' coroutines end with the io_context.
  impl_->pool.join();
  impl_->io.stop();
  for (auto& t : impl_->io_threads) t.join();
  if (!impl_->unix_path.empty()) unlink(impl_->unix_path.c_str());
}

Status CheckTlsFiles(const std::string& tls_cert_file, const std::string& tls_key_file,
                     const std::string& setting_prefix) {
  return MakeTlsContext(tls_cert_file, tls_key_file, setting_prefix).status();
}

}  // namespace offloadd::daemon::openai
