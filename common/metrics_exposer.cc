#include "common/metrics_exposer.h"

#include <prometheus/text_serializer.h>

#include <atomic>
#include <boost/asio.hpp>
#include <cctype>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"

namespace offloadd {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr size_t kMaxRequestHead = 16 * 1024;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// The parts of a request head that decide the answer.
struct RequestHead {
  std::string method, path, version;
  bool keep_alive = false;
  bool has_body = false;
  bool valid = false;
};

RequestHead ParseHead(const std::string& head) {
  RequestHead r;
  size_t eol = head.find("\r\n");
  const std::string line = head.substr(0, eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.find(' ', sp2 + 1) != std::string::npos) return r;
  r.method = line.substr(0, sp1);
  const std::string target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  r.version = line.substr(sp2 + 1);
  if (r.method.empty() || target.empty() || (r.version != "HTTP/1.1" && r.version != "HTTP/1.0")) {
    return r;
  }
  r.path = target.substr(0, target.find('?'));
  r.keep_alive = r.version == "HTTP/1.1";
  while (eol != std::string::npos && eol + 2 < head.size()) {
    const size_t next = head.find("\r\n", eol + 2);
    const std::string h = head.substr(eol + 2, next - eol - 2);
    eol = next;
    if (h.empty()) break;
    const size_t colon = h.find(':');
    if (colon == std::string::npos || colon == 0) return r;
    const std::string name = Lower(h.substr(0, colon));
    const std::string value = Lower(Trim(h.substr(colon + 1)));
    if (name == "connection") {
      if (value.find("close") != std::string::npos) r.keep_alive = false;
      if (value.find("keep-alive") != std::string::npos) r.keep_alive = true;
    } else if (name == "transfer-encoding" || (name == "content-length" && value != "0")) {
      r.has_body = true;  // a scrape carries none; answered, then the connection is closed
    }
  }
  r.valid = true;
  return r;
}

// The server's state, shared by the acceptor and every connection.
struct ServerState {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread thread;
  uint16_t port = 0;
  std::atomic<int> idle_timeout_ms{30000};
  std::mutex mu;
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables;

  // Serialises every live collectable; expired ones are dropped.
  std::string Scrape() {
    std::vector<prometheus::MetricFamily> families;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = collectables.begin(); it != collectables.end();) {
        if (auto c = it->lock()) {
          auto f = c->Collect();
          families.insert(families.end(), std::make_move_iterator(f.begin()),
                          std::make_move_iterator(f.end()));
          ++it;
        } else {
          it = collectables.erase(it);
        }
      }
    }
    return prometheus::TextSerializer().Serialize(families);
  }

  void Accept();
};

// One client connection: read a head, answer it, repeat while keep-alive holds.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ServerState* owner)
      : socket_(std::move(socket)), timer_(socket_.get_executor()), owner_(owner) {}

  void ReadRequest() {
    auto self = shared_from_this();
    timer_.expires_after(std::chrono::milliseconds(owner_->idle_timeout_ms.load()));
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) {
        boost::system::error_code ignored;
        self->socket_.close(ignored);
      }
    });
    asio::async_read_until(socket_, buf_, "\r\n\r\n",
                           [self](const boost::system::error_code& ec, size_t n) { self->OnHead(ec, n); });
  }

 private:
  void OnHead(const boost::system::error_code& ec, size_t n) {
    timer_.cancel();
    if (ec == asio::error::not_found) {
      return Reply(431, "Request Header Fields Too Large", "request head over 16 KiB\n", false, true);
    }
    if (ec) return;  // closed by the client or by the idle timer
    const std::string head(asio::buffers_begin(buf_.data()), asio::buffers_begin(buf_.data()) + n);
    buf_.consume(n);
    const RequestHead r = ParseHead(head);
    if (!r.valid) return Reply(400, "Bad Request", "malformed HTTP request\n", false, true);
    const bool keep = r.keep_alive && !r.has_body;
    if (r.method != "GET" && r.method != "HEAD") {
      return Reply(405, "Method Not Allowed", "only GET and HEAD are served\n", keep, true);
    }
    const bool body = r.method == "GET";
    if (r.path != "/metrics") {
      return Reply(404, "Not Found", "metrics are served at /metrics\n", keep, body);
    }
    std::string text;
    try {
      text = owner_->Scrape();
    } catch (const std::exception& e) {
      OFFLOADD_LOG(kWarning, "metrics") << "collecting metrics failed: " << e.what();
      return Reply(500, "Internal Server Error", std::string("collecting metrics failed: ") + e.what() + "\n",
                   false, body);
    }
    Reply(200, "OK", text, keep, body, "text/plain; version=0.0.4; charset=utf-8");
  }

  void Reply(int code, const char* reason, const std::string& content, bool keep_alive, bool with_body,
             const char* type = "text/plain; charset=utf-8") {
    out_ = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
           "\r\nContent-Length: " + std::to_string(content.size()) +
           "\r\nConnection: " + (keep_alive ? "keep-alive" : "close") + "\r\n\r\n";
    if (with_body) out_ += content;
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_), [self, keep_alive](const boost::system::error_code& ec, size_t) {
      if (!ec && keep_alive) return self->ReadRequest();
      boost::system::error_code ignored;
      self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
      self->socket_.close(ignored);
    });
  }

  tcp::socket socket_;
  asio::steady_timer timer_;
  asio::streambuf buf_{kMaxRequestHead};
  std::string out_;
  ServerState* owner_;
};

void ServerState::Accept() {
  acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted) return;
    if (!ec) std::make_shared<Connection>(std::move(socket), this)->ReadRequest();
    Accept();  // a failed accept (e.g. out of descriptors) does not stop the server
  });
}

}  // namespace

struct MetricsExposer::Impl : ServerState {};

StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(const std::string& listen) {
  std::string host, port;
  if (!listen.empty() && listen.front() == '[') {
    const size_t close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return InvalidArgumentError("metrics address '" + listen + "': expected [v6-address]:port");
    }
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) {
      return InvalidArgumentError("metrics address '" + listen + "': expected host:port");
    }
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
  }
  if (host.empty() || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535) {
    return InvalidArgumentError("metrics address '" + listen + "': expected host:port with port 0-65535");
  }

  auto impl = std::make_unique<Impl>();
  boost::system::error_code ec;
  tcp::resolver resolver(impl->io);
  const auto endpoints = resolver.resolve(host, port, tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    return UnavailableError("metrics address '" + listen + "': cannot resolve " + host + ": " + ec.message());
  }
  const tcp::endpoint endpoint = *endpoints.begin();
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return UnavailableError("cannot listen on " + listen + ": " + ec.message());
  impl->port = impl->acceptor.local_endpoint().port();
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<MetricsExposer>(new MetricsExposer(std::move(impl)));
}

MetricsExposer::MetricsExposer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsExposer::~MetricsExposer() {
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void MetricsExposer::RegisterCollectable(const std::weak_ptr<prometheus::Collectable>& collectable) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->collectables.push_back(collectable);
}

uint16_t MetricsExposer::port() const { return impl_->port; }

void MetricsExposer::set_idle_timeout_ms(int ms) { impl_->idle_timeout_ms = ms; }

}  // namespace offloadd
