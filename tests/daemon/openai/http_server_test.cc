#include "daemon/openai/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <string>

namespace offloadd::daemon::openai {
namespace {

// A plain blocking HTTP/1.1 client on one connection (a receive timeout, so a test never hangs).
class Connection {
 public:
  explicit Connection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  ~Connection() { close(fd_); }
  void Send(const std::string& data) {
    ASSERT_EQ(send(fd_, data.data(), data.size(), MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
  }
  // One response: its status line, headers and a Content-Length body; "" when the connection
  // closed first.
  std::string Response() {
    while (buffer_.find("\r\n\r\n") == std::string::npos) {
      if (!Fill()) return "";
    }
    const size_t header_end = buffer_.find("\r\n\r\n") + 4;
    size_t length = 0;
    const size_t cl = buffer_.find("Content-Length: ");
    if (cl != std::string::npos && cl < header_end) length = std::stoul(buffer_.substr(cl + 16));
    while (buffer_.size() < header_end + length) {
      if (!Fill()) return "";
    }
    std::string response = buffer_.substr(0, header_end + length);
    buffer_.erase(0, header_end + length);
    return response;
  }
  bool Closed() { return buffer_.empty() && !Fill(); }

 private:
  bool Fill() {
    char chunk[4096];
    const ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffer_.append(chunk, static_cast<size_t>(n));
    return true;
  }
  int fd_;
  std::string buffer_;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServer::Options options;
    options.listen = "127.0.0.1:0";
    options.max_body_bytes = 1000;
    options.authenticate = [](const std::string& authorization,
                              const HttpPeer&) -> StatusOr<std::string> {
      if (authorization == "Bearer good") return std::string("token:alice");
      return Status(StatusCode::kUnauthenticated, "invalid bearer token");
    };
    options.error = [](int status, const std::string& message, const std::string& code) {
      return HttpResponse{status, "{\"error\": \"" + code + ": " + message + "\"}"};
    };
    auto server = HttpServer::Start(options, [this](const HttpRequest& r) {
      ++handled_;
      return HttpResponse{200, r.method + " " + r.target + " " + r.client + " " + r.content_type +
                                   " [" + r.body + "]"};
    });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
  }
  std::unique_ptr<HttpServer> server_;
  std::atomic<int> handled_{0};
};

TEST_F(HttpServerTest, AuthenticatedRequestsReachTheHandlerOnOneKeptAliveConnection) {
  Connection c(server_->port());
  c.Send(
      "POST /v1/x?a=1 HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer good\r\n"
      "Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello");
  std::string r = c.Response();
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find("POST /v1/x?a=1 token:alice text/plain [hello]"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Type: application/json"), std::string::npos) << r;
  c.Send("GET /v1/y HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer good\r\n\r\n");
  r = c.Response();
  EXPECT_NE(r.find("GET /v1/y token:alice  []"), std::string::npos) << r;
  EXPECT_EQ(handled_.load(), 2);
}

TEST_F(HttpServerTest, AMissingOrWrongTokenIsRefusedBeforeTheBodyIsRead) {
  for (const std::string auth : {"", "Authorization: Bearer bad\r\n", "Authorization: good\r\n"}) {
    Connection c(server_->port());
    // The body is announced but never sent: the answer must not wait for it.
    c.Send("POST /v1/files HTTP/1.1\r\nHost: h\r\n" + auth + "Content-Length: 500\r\n\r\n");
    const std::string r = c.Response();
    EXPECT_EQ(r.rfind("HTTP/1.1 401", 0), 0u) << auth << ": " << r;
    EXPECT_NE(r.find("invalid_api_key: invalid bearer token"), std::string::npos) << r;
    EXPECT_TRUE(c.Closed());
  }
  EXPECT_EQ(handled_.load(), 0);
}

TEST_F(HttpServerTest, OversizedBodiesGet413WithoutBeingRead) {
  {
    Connection c(server_->port());
    c.Send(
        "POST /v1/files HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer good\r\nContent-Length: "
        "1001\r\n\r\n");
    const std::string r = c.Response();
    EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
    EXPECT_NE(
        r.find("request_too_large: request body of 1001 bytes is larger than the limit of 1000"),
        std::string::npos)
        << r;
    EXPECT_TRUE(c.Closed());
  }
  {  // chunked: no length up front, refused once the body passes the limit
    Connection c(server_->port());
    c.Send(
        "POST /v1/files HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer good\r\n"
        "Transfer-Encoding: chunked\r\n\r\n3e8\r\n" +
        std::string(1000, 'x') + "\r\n10\r\n" + std::string(16, 'y') + "\r\n0\r\n\r\n");
    const std::string r = c.Response();
    EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
  }
  EXPECT_EQ(handled_.load(), 0);
  Connection c(server_->port());  // exactly the limit is served
  c.Send(
      "POST /v HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer good\r\nContent-Length: 1000\r\n\r\n" +
      std::string(1000, 'z'));
  EXPECT_EQ(c.Response().rfind("HTTP/1.1 200", 0), 0u);
}

TEST_F(HttpServerTest, MalformedRequestsAndHugeHeadersAreAnsweredThenClosed) {
  {
    Connection c(server_->port());
    c.Send("NOT HTTP AT ALL\r\n\r\n");
    const std::string r = c.Response();
    EXPECT_EQ(r.rfind("HTTP/1.1 400", 0), 0u) << r;
    EXPECT_TRUE(c.Closed());
  }
  {
    Connection c(server_->port());
    c.Send("GET / HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
    const std::string r = c.Response();
    EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r;
  }
  EXPECT_EQ(handled_.load(), 0);
}

TEST(HttpServerStartTest, AnAddressInUseOrMalformedIsRefusedNamingIt) {
  HttpServer::Options options;
  options.authenticate = [](const std::string&, const HttpPeer&) -> StatusOr<std::string> {
    return std::string("x");
  };
  options.error = [](int status, const std::string& m, const std::string&) {
    return HttpResponse{status, m};
  };
  const auto handler = [](const HttpRequest&) { return HttpResponse{}; };
  options.listen = "127.0.0.1:0";
  auto first = HttpServer::Start(options, handler);
  ASSERT_TRUE(first.ok());
  options.listen = "127.0.0.1:" + std::to_string((*first)->port());
  auto second = HttpServer::Start(options, handler);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("cannot listen on " + options.listen), std::string::npos)
      << second.status().message();
  options.listen = "no-port";
  EXPECT_EQ(HttpServer::Start(options, handler).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offloadd::daemon::openai
