#include "common/metrics_exposer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace offloadd {
namespace {

// A blocking loopback client: connect, send raw bytes, read what comes back.
class RawClient {
 public:
  explicit RawClient(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~RawClient() { ::close(fd_); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) { ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), (ssize_t)bytes.size()); }

  // Reads until `stop` appears in all that this connection has read, the peer closes, or 5 s
  // pass; returns all that was read.
  std::string ReadUntil(const std::string& stop = "") {
    return ReadWhile([&](const std::string& got) { return stop.empty() || got.find(stop) == std::string::npos; });
  }
  template <typename Pred>
  std::string ReadWhile(Pred more) {
    std::string& got = got_;
    char buf[4096];
    while (more(got)) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 5000) <= 0) break;
      const ssize_t n = ::read(fd_, buf, sizeof(buf));
      if (n <= 0) break;
      got.append(buf, n);
    }
    return got;
  }
  // True when the server closed the connection within 5 s.
  bool Closed() {
    pollfd p{fd_, POLLIN, 0};
    char c;
    return ::poll(&p, 1, 5000) == 1 && ::read(fd_, &c, 1) == 0;
  }

 private:
  int fd_ = -1;
  std::string got_;
  bool connected_ = false;
};

class MetricsExposerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<prometheus::Registry>();
    prometheus::BuildCounter().Name("exposer_test_events_total").Help("Events.").Register(*registry_).Add({{"kind", "a"}}).Increment(3);
    auto started = MetricsExposer::Start("127.0.0.1:0");
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    exposer_ = std::move(*started);
    exposer_->RegisterCollectable(registry_);
  }
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsExposer> exposer_;
};

TEST_F(MetricsExposerTest, ServesTheRegistryInTextFormat) {
  ASSERT_NE(exposer_->port(), 0);
  RawClient c(exposer_->port());
  ASSERT_TRUE(c.connected());
  c.Send("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string r = c.ReadUntil();
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << r;
  EXPECT_NE(r.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << r;
  EXPECT_NE(r.find("exposer_test_events_total{kind=\"a\"} 3"), std::string::npos) << r;
  const size_t body = r.find("\r\n\r\n") + 4;
  EXPECT_NE(r.find("Content-Length: " + std::to_string(r.size() - body)), std::string::npos) << r;
}

TEST_F(MetricsExposerTest, KeepAliveAnswersSeveralRequestsOnOneConnection) {
  RawClient c(exposer_->port());
  // Two pipelined requests, then a third after the answers: all on one connection.
  c.Send("GET /metrics HTTP/1.1\r\n\r\nHEAD /metrics?x=1 HTTP/1.1\r\n\r\n");
  // The HEAD answer carries no body: both answers are in once a second head has ended.
  const auto both_in = [](const std::string& got) {
    const size_t second = got.find("HTTP/1.1 200 OK", 1);
    return second != std::string::npos && got.find("\r\n\r\n", second) != std::string::npos;
  };
  const std::string r = c.ReadWhile([&](const std::string& got) { return !both_in(got); });
  ASSERT_TRUE(both_in(r)) << r;
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK", 0), 0u);
  const size_t second = r.find("HTTP/1.1 200 OK", 1);
  EXPECT_NE(r.find("exposer_test_events_total"), std::string::npos);
  EXPECT_EQ(r.find("exposer_test_events_total", second), std::string::npos) << "HEAD answered with a body";
  EXPECT_EQ(r.size(), r.find("\r\n\r\n", second) + 4) << "bytes after the HEAD answer";
  c.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string third = c.ReadUntil().substr(r.size());
  EXPECT_NE(third.find("exposer_test_events_total"), std::string::npos);
  EXPECT_NE(third.find("Connection: close"), std::string::npos);
}

TEST_F(MetricsExposerTest, RefusesOtherPathsMethodsAndMalformedHeads) {
  {
    RawClient c(exposer_->port());
    c.Send("GET / HTTP/1.1\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(c.ReadUntil().rfind("HTTP/1.1 404 ", 0), 0u);
  }
  {
    RawClient c(exposer_->port());
    c.Send("POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi");
    const std::string r = c.ReadUntil();
    EXPECT_EQ(r.rfind("HTTP/1.1 405 ", 0), 0u) << r;
    EXPECT_NE(r.find("Connection: close"), std::string::npos) << r;
  }
  {
    RawClient c(exposer_->port());
    c.Send("garbage\r\n\r\n");
    EXPECT_EQ(c.ReadUntil().rfind("HTTP/1.1 400 ", 0), 0u);
  }
  {
    RawClient c(exposer_->port());
    c.Send("GET /metrics HTTP/1.1\r\nX-Long: " + std::string(20000, 'a'));
    EXPECT_EQ(c.ReadUntil().rfind("HTTP/1.1 431 ", 0), 0u);
  }
}

TEST_F(MetricsExposerTest, IdleConnectionsAreClosedAndDoNotBlockOthers) {
  exposer_->set_idle_timeout_ms(200);
  RawClient idle(exposer_->port());
  idle.Send("GET /metr");  // never completes its head
  RawClient other(exposer_->port());
  other.Send("GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_NE(other.ReadUntil().find("exposer_test_events_total"), std::string::npos);
  EXPECT_TRUE(idle.Closed());
}

TEST_F(MetricsExposerTest, ExpiredCollectablesAreDropped) {
  registry_.reset();
  RawClient c(exposer_->port());
  c.Send("GET /metrics HTTP/1.0\r\n\r\n");
  const std::string r = c.ReadUntil();
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK", 0), 0u);
  EXPECT_EQ(r.find("exposer_test_events_total"), std::string::npos);
}

TEST(MetricsExposerStartTest, BadAddressesAreNamed) {
  for (const char* bad : {"9400", "host:", ":80", "127.0.0.1:99999", "127.0.0.1:http", "[::1]9400"}) {
    auto r = MetricsExposer::Start(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().ToString();
  }
  auto a = MetricsExposer::Start("127.0.0.1:0");
  ASSERT_TRUE(a.ok());
  auto b = MetricsExposer::Start("127.0.0.1:" + std::to_string((*a)->port()));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("cannot listen"), std::string::npos) << b.status().ToString();
}

}  // namespace
}  // namespace offloadd
