// HttpServer over its other transports: HTTPS (a self-signed certificate made here, with
// OpenSSL) and a Unix socket (its mode, a stale socket, the peer's uid). The limits and the
// plain-HTTP refusals are http_server_test.cc's; here they are checked to hold on each transport.

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "daemon/openai/http_server.h"

namespace offloadd::daemon::openai {
namespace {

namespace asio = boost::asio;
namespace ssl = asio::ssl;
namespace http = boost::beast::http;

struct Pem {
  std::string cert, key;
};

std::string ToPem(int (*write)(BIO*, void*), void* object) {
  BIO* bio = BIO_new(BIO_s_mem());
  write(bio, object);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

// A self-signed P-256 certificate for localhost and 127.0.0.1, valid for an hour.
Pem SelfSigned() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  X509_EXTENSION* san =
      X509V3_EXT_conf_nid(nullptr, &ctx, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1");
  X509_add_ext(x, san, -1);
  X509_EXTENSION_free(san);
  X509_sign(x, key, EVP_sha256());
  Pem pem;
  pem.cert = ToPem([](BIO* b, void* o) { return PEM_write_bio_X509(b, static_cast<X509*>(o)); }, x);
  pem.key = ToPem(
      [](BIO* b, void* o) {
        return PEM_write_bio_PrivateKey(b, static_cast<EVP_PKEY*>(o), nullptr, nullptr, 0, nullptr,
                                        nullptr);
      },
      key);
  X509_free(x);
  EVP_PKEY_free(key);
  return pem;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/offloadd-http-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  std::string Write(const std::string& name, const std::string& text) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

HttpServer::Options BaseOptions() {
  HttpServer::Options options;
  options.max_body_bytes = 1000;
  options.setting_prefix = "server.openai_api.";
  options.authenticate = [](const std::string& authorization,
                            const HttpPeer& peer) -> StatusOr<std::string> {
    if (peer.unix_socket) return "unix:uid=" + std::to_string(peer.uid);
    if (authorization == "Bearer good") return std::string("token:alice");
    return Status(StatusCode::kUnauthenticated, "invalid bearer token");
  };
  options.error = [](int status, const std::string& message, const std::string& code) {
    return HttpResponse{status, "{\"error\": \"" + code + ": " + message + "\"}"};
  };
  return options;
}

HttpResponse Echo(const HttpRequest& r) {
  return HttpResponse{200, r.method + " " + r.target + " " + r.client + " [" + r.body + "]"};
}

http::request<http::string_body> Request(const std::string& target, const std::string& body) {
  http::request<http::string_body> req{body.empty() ? http::verb::get : http::verb::post, target,
                                       11};
  req.set(http::field::host, "localhost");
  req.set(http::field::authorization, "Bearer good");
  req.body() = body;
  req.prepare_payload();
  return req;
}

class HttpServerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pem_ = SelfSigned();
    HttpServer::Options options = BaseOptions();
    options.listen = "127.0.0.1:0";
    options.tls_cert_file = dir_.Write("cert.pem", pem_.cert);
    options.tls_key_file = dir_.Write("key.pem", pem_.key);
    auto server = HttpServer::Start(options, [this](const HttpRequest& r) {
      ++handled_;
      return Echo(r);
    });
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  // One request over a verified TLS connection (the certificate as the only CA, the host name
  // checked).
  http::response<http::string_body> Https(const http::request<http::string_body>& req) {
    asio::io_context io;
    ssl::context ctx(ssl::context::tls_client);
    ctx.add_certificate_authority(asio::buffer(pem_.cert));
    ctx.set_verify_mode(ssl::verify_peer);
    ssl::stream<asio::ip::tcp::socket> stream(io, ctx);
    stream.set_verify_callback(ssl::host_name_verification("localhost"));
    SSL_set_tlsext_host_name(stream.native_handle(), "localhost");
    stream.lowest_layer().connect(
        {asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(server_->port())});
    stream.handshake(ssl::stream_base::client);
    http::write(stream, req);
    boost::beast::flat_buffer buffer;
    http::response<http::string_body> res;
    http::read(stream, buffer, res);
    return res;
  }

  TempDir dir_;
  Pem pem_;
  std::unique_ptr<HttpServer> server_;
  std::atomic<int> handled_{0};
};

TEST_F(HttpServerTlsTest, RequestsAreServedAfterAVerifiedHandshakeWithTheSameLimits) {
  auto res = Https(Request("/v1/x", "hello"));
  EXPECT_EQ(res.result_int(), 200);
  EXPECT_EQ(res.body(), "POST /v1/x token:alice [hello]");
  res = Https(Request("/v1/files", std::string(1001, 'x')));
  EXPECT_EQ(res.result_int(), 413) << res.body();
  auto no_token = Request("/v1/y", "");
  no_token.erase(http::field::authorization);
  res = Https(no_token);
  EXPECT_EQ(res.result_int(), 401) << res.body();
  EXPECT_EQ(handled_.load(), 1);
}

// A client that does not trust the certificate fails its handshake; the server serves on.
TEST_F(HttpServerTlsTest, AnUntrustedCertificateFailsTheClientsHandshake) {
  asio::io_context io;
  ssl::context ctx(ssl::context::tls_client);
  ctx.set_verify_mode(ssl::verify_peer);  // no CA: the self-signed certificate is not trusted
  ssl::stream<asio::ip::tcp::socket> stream(io, ctx);
  stream.lowest_layer().connect(
      {asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(server_->port())});
  boost::system::error_code ec;
  stream.handshake(ssl::stream_base::client, ec);
  EXPECT_TRUE(ec) << "the handshake passed without a CA";
  EXPECT_EQ(Https(Request("/v1/x", "")).result_int(), 200);
}

TEST_F(HttpServerTlsTest, PlainHttpToTheTlsPortIsRefusedInPlainHttpAndClosed) {
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(server_->port())});
  // A body larger than what the first read takes: the answer still arrives (no reset).
  http::write(socket, Request("/v1/files", std::string(200000, 's')));
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> res;
  http::read(socket, buffer, res);
  EXPECT_EQ(res.result_int(), 400);
  EXPECT_NE(res.body().find("tls_required: this address serves HTTPS only"), std::string::npos)
      << res.body();
  char byte;
  boost::system::error_code ec;
  socket.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_EQ(ec, asio::error::eof);  // closed
  EXPECT_EQ(handled_.load(), 0);
}

TEST(HttpServerTlsFilesTest, ABadCertificateOrKeyIsRefusedNamingTheSettingAndFile) {
  TempDir dir;
  const Pem pem = SelfSigned();
  const Pem other = SelfSigned();
  const std::string cert = dir.Write("cert.pem", pem.cert);
  const std::string key = dir.Write("key.pem", pem.key);
  const std::string garbage = dir.Write("garbage.pem", "not a certificate\n");
  const std::string other_key = dir.Write("other-key.pem", other.key);
  const std::string p = "server.openai_api.";
  EXPECT_TRUE(CheckTlsFiles(cert, key, p).ok()) << CheckTlsFiles(cert, key, p).ToString();
  const struct {
    std::string cert, key, says;
  } cases[] = {
      {dir.path() + "/missing.pem", key, p + "tls_cert_file " + dir.path() + "/missing.pem"},
      {cert, dir.path() + "/missing.pem", p + "tls_key_file " + dir.path() + "/missing.pem"},
      {garbage, key, p + "tls_cert_file " + garbage + ": not a PEM certificate chain"},
      {key, key, p + "tls_cert_file " + key + ": not a PEM certificate chain"},
      {cert, garbage, p + "tls_key_file " + garbage + ": not an unencrypted PEM private key"},
      {cert, cert, p + "tls_key_file " + cert + ": not an unencrypted PEM private key"},
      {cert, other_key,
       p + "tls_key_file " + other_key + " is not the key of " + p + "tls_cert_file " + cert},
  };
  for (const auto& c : cases) {
    const Status s = CheckTlsFiles(c.cert, c.key, p);
    EXPECT_FALSE(s.ok()) << c.says;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s.message();
    // Start refuses the same, before listening.
    HttpServer::Options options = BaseOptions();
    options.listen = "127.0.0.1:0";
    options.tls_cert_file = c.cert;
    options.tls_key_file = c.key;
    auto server = HttpServer::Start(options, Echo);
    ASSERT_FALSE(server.ok());
    EXPECT_EQ(server.status().message(), s.message());
  }
}

// A blocking HTTP/1.1 exchange on a Unix socket.
std::string UnixRequest(const std::string& path, const std::string& request) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "connect failed";
  }
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response;
  char chunk[4096];
  for (ssize_t n; (n = recv(fd, chunk, sizeof chunk, 0)) > 0;) response.append(chunk, n);
  close(fd);
  return response;
}

TEST(HttpServerUnixTest, ServesOnTheSocketWithItsModeAsItsPeersUserAndRemovesIt) {
  TempDir dir;
  const std::string path = dir.path() + "/api.sock";
  HttpServer::Options options = BaseOptions();
  options.listen = "unix:" + path;
  options.unix_socket_mode = 0600;
  auto server = HttpServer::Start(options, Echo);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ((*server)->port(), 0);
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);

  // No token: the caller is the user it runs as.
  std::string r =
      UnixRequest(path, "GET /v1/files HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200", 0), 0u) << r;
  EXPECT_NE(r.find("GET /v1/files unix:uid=" + std::to_string(getuid()) + " []"), std::string::npos)
      << r;
  // The limits hold here too.
  r = UnixRequest(path, "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 413", 0), 0u) << r;
  r = UnixRequest(path, "GET / HTTP/1.1\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 431", 0), 0u) << r;

  (*server)->Shutdown();
  EXPECT_NE(lstat(path.c_str(), &st), 0) << "the socket outlived the server";
}

TEST(HttpServerUnixTest, AStaleSocketIsReplacedALiveOneAndAFileAreRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/api.sock";
  {  // a crashed server's socket: bound, never unlinked, nobody accepting
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    close(fd);
  }
  HttpServer::Options options = BaseOptions();
  options.listen = "unix:" + path;
  auto first = HttpServer::Start(options, Echo);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = HttpServer::Start(options, Echo);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("already serving on " + path), std::string::npos)
      << second.status().message();
  // The first still serves: the refused second did not take its path.
  EXPECT_EQ(
      UnixRequest(path, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n").rfind("HTTP/1.1 200", 0),
      0u);
  first->reset();

  const std::string file = dir.Write("file", "x");
  options.listen = "unix:" + file;
  auto on_file = HttpServer::Start(options, Echo);
  ASSERT_FALSE(on_file.ok());
  EXPECT_NE(on_file.status().message().find("server.openai_api.listen " + file +
                                            " exists and is not a socket"),
            std::string::npos)
      << on_file.status().message();
}

}  // namespace
}  // namespace offloadd::daemon::openai
