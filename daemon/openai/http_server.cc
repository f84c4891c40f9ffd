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

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <exception>
#include <limits>
#include <thread>
#include <vector>

#include "common/logging.h"

namespace offloadd::daemon::openai {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;

constexpr const char* kLog = "openai-api";
constexpr uint32_t kMaxHeaderBytes = 16 * 1024;

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
  asio::io_context io;
  tcp::acceptor acceptor{io};
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

  asio::awaitable<void> Send(beast::tcp_stream& stream, const HttpResponse& r, unsigned version,
                             bool keep_alive) {
    auto res = ToBeast(r, version, keep_alive);
    boost::system::error_code ec;
    stream.expires_after(Timeout());
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

  // One connection: requests in turn (HTTP/1.1 keep-alive) until the client closes, a timeout, an
  // error response that ends it, or shutdown.
  //
  // No temporary with a destructor appears in a co_await expression here: GCC 12 destroys some of
  // them twice (a double free, seen in HttpServerTest); responses are named locals instead.
  asio::awaitable<void> Serve(tcp::socket socket) {
    struct Count {
      std::atomic<int>& n;
      ~Count() { --n; }
    } count{connections};
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    while (!stopping.load()) {
      http::request_parser<http::string_body> parser;
      parser.header_limit(kMaxHeaderBytes);
      // No body limit while the header is read: Beast would refuse a large Content-Length there,
      // before the caller is authenticated. It is set once the caller is known. (Not boost::none:
      // Beast 1.74 compares a length with an empty limit as greater, refusing every body.)
      parser.body_limit(std::numeric_limits<std::uint64_t>::max());
      boost::system::error_code ec;
      stream.expires_after(Timeout());
      co_await http::async_read_header(stream, buffer, parser,
                                       asio::redirect_error(asio::use_awaitable, ec));
      if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
          ec == asio::error::eof || ec == asio::error::connection_reset ||
          ec == asio::error::operation_aborted) {
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
        if (co_await Refused(stream, buffer, parser, &client, &response)) {
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
    boost::system::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  }

  // After the header: authenticates, bounds and reads the body. True with `*refusal` set when the
  // request is answered without its handler (its status 0 when the connection failed).
  asio::awaitable<bool> Refused(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                http::request_parser<http::string_body>& parser,
                                std::string* client_out, HttpResponse* refusal) {
    const auto& header = parser.get();
    auto client = options.authenticate(std::string(header[http::field::authorization]));
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
    stream.expires_after(Timeout());
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
  asio::awaitable<void> Accept() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket socket =
          co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec == asio::error::operation_aborted || stopping.load()) co_return;
      if (ec) {
        OFFLOADD_LOG(kWarning, kLog) << "accept: " << ec.message();
        continue;
      }
      if (connections.load() >= options.max_connections) {
        OFFLOADD_LOG(kWarning, kLog)
            << "connection refused: " << options.max_connections << " connections open already";
        continue;  // the socket closes as it goes out of scope
      }
      ++connections;
      asio::co_spawn(io, Serve(std::move(socket)), asio::detached);
    }
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Options options, Handler handler) {
  if (!options.authenticate || !options.error || !handler) {
    return InvalidArgumentError("HttpServer needs authenticate, error and a handler");
  }
  auto impl = std::make_unique<Impl>(std::move(options), std::move(handler));
  ASSIGN_OR_RETURN(tcp::endpoint endpoint, ResolveListen(impl->io, impl->options.listen));
  boost::system::error_code ec;
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("cannot listen on " + impl->options.listen + ": " + ec.message());
  impl->port = impl->acceptor.local_endpoint().port();
  asio::co_spawn(impl->io, impl->Accept(), asio::detached);
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
    impl->acceptor.close(ignored);
  });
  // Handlers that are running finish; then the connections' coroutines end with the io_context.
  impl_->pool.join();
  impl_->io.stop();
  for (auto& t : impl_->io_threads) t.join();
}

}  // namespace offloadd::daemon::openai
