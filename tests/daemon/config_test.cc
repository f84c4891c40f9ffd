#include "daemon/config/config.h"

#include <gtest/gtest.h>

namespace offloadd::daemon {
namespace {

StatusOr<DaemonConfig> Parse(const std::string& yaml) { return ParseConfig(yaml, "test.yaml"); }

std::string ErrorOf(const std::string& yaml) {
  auto c = Parse(yaml);
  EXPECT_FALSE(c.ok()) << "expected an error for:\n" << yaml;
  return c.ok() ? "" : c.status().message();
}

TEST(ConfigTest, EmptyFileGivesDefaults) {
  auto c = Parse("");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server.unix_socket, "/run/offloadd/offloadd.sock");
  EXPECT_EQ(c->server.unix_socket_mode, 0660u);
  EXPECT_EQ(c->metrics.listen, "127.0.0.1:9464");
  EXPECT_EQ(c->storage.aio.block_size, 1u << 20);
  EXPECT_EQ(c->log_level, LogSeverity::kInfo);
}

TEST(ConfigTest, ReadsEverySection) {
  auto c = Parse(R"(
log_level: debug
state_dir: /srv/offloadd
allowed_roots: [/srv/models, /srv/data]
server:
  unix_socket: /tmp/x.sock
  unix_socket_mode: "0600"
  max_request_bytes: 8MiB
  shutdown_grace_seconds: 5
  max_active_jobs_per_client: 20
  max_watchers_per_client: 8
  max_threads: 64
metrics:
  listen: 0.0.0.0:0
  peak_flops: 989e12
  job_series_retention_seconds: 120
storage:
  directories:
    - path: /nvme0/offloadd
      weight: 2
    - /nvme1/offloadd
  aio: {block_size: 4MiB, queue_depth: 64}
workers: {processes: 2, threads_per_process: 8, pin_cores: false}
memory: {host_memory_limit: 200GiB, gpu_memory_limit: 24GiB}
)");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->log_level, LogSeverity::kDebug);
  EXPECT_EQ(c->allowed_roots.size(), 2u);
  EXPECT_EQ(c->server.unix_socket_mode, 0600u);
  EXPECT_EQ(c->server.max_request_bytes, 8u << 20);
  EXPECT_EQ(c->server.max_active_jobs_per_client, 20u);
  EXPECT_EQ(c->server.max_watchers_per_client, 8u);
  EXPECT_EQ(c->server.max_threads, 64u);
  ASSERT_EQ(c->storage.directories.size(), 2u);
  EXPECT_EQ(c->storage.directories[0].weight, 2.0);
  EXPECT_EQ(c->storage.directories[1].path, "/nvme1/offloadd");
  EXPECT_EQ(c->storage.aio.queue_depth, 64u);
  EXPECT_EQ(c->workers.threads_per_process, 8u);
  EXPECT_FALSE(c->workers.pin_cores);
  EXPECT_EQ(c->memory.gpu_memory_limit, 24ull << 30);
  EXPECT_EQ(c->metrics.peak_flops, 989e12);
  EXPECT_EQ(c->metrics.job_series_retention_seconds, 120);
}

TEST(ConfigTest, UnknownKeysAreNamedWithTheirPath) {
  const std::string e = ErrorOf("server:\n  tcp:\n    lissten: 1.2.3.4:5\nbogus: 1\n");
  EXPECT_NE(e.find("server.tcp.lissten: unknown key"), std::string::npos) << e;
  EXPECT_NE(e.find("bogus: unknown key"), std::string::npos) << e;
  EXPECT_NE(e.find("2 problems"), std::string::npos) << e;
}

TEST(ConfigTest, BadValuesNameKeyAndValue) {
  EXPECT_NE(ErrorOf("workers: {processes: -1}").find("workers.processes: expected a non-negative integer, got '-1'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("server: {unix_socket_mode: rw}").find("server.unix_socket_mode: expected an octal"),
            std::string::npos);
  EXPECT_NE(ErrorOf("storage: {aio: {block_size: 12 parsecs}}").find("storage.aio.block_size: unknown size unit"),
            std::string::npos);
  EXPECT_NE(ErrorOf("storage: {aio: {block_size: 6000}}").find("multiple of 4096"), std::string::npos);
  EXPECT_NE(ErrorOf("storage: {aio: {queue_depth: 0}}").find("storage.aio.queue_depth: must be between 1"),
            std::string::npos);
  EXPECT_NE(ErrorOf("log_level: loud").find("log_level: expected debug"), std::string::npos);
  EXPECT_NE(ErrorOf("workers: {pin_cores: maybe}").find("workers.pin_cores: expected true or false"),
            std::string::npos);
  // A raw 0xe9 byte (Latin-1), not the YAML escape "\xe9" (which is U+00E9, valid UTF-8).
  EXPECT_NE(ErrorOf("state_dir: /tmp/caf\xe9\n").find("state_dir: is not valid UTF-8"), std::string::npos)
      << ErrorOf("state_dir: /tmp/caf\xe9\n");
  // The short form of a store directory too (fuzz regression daemon_config/non-utf8-short-store-directory).
  EXPECT_NE(ErrorOf("storage:\n  directories:\n    - /srv/caf\xe9\n").find("storage.directories[0]: is not valid UTF-8"),
            std::string::npos)
      << ErrorOf("storage:\n  directories:\n    - /srv/caf\xe9\n");
  EXPECT_NE(ErrorOf("workers: {adamw_kernel: sse9}").find("workers.adamw_kernel: AdamW kernel: unknown kernel path 'sse9'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("allowed_roots: relative/dir").find("allowed_roots: expected a list"), std::string::npos);
  EXPECT_NE(ErrorOf("allowed_roots: [relative/dir]").find("allowed_roots[0]: must be an absolute path"),
            std::string::npos);
  EXPECT_NE(ErrorOf("server: [1, 2]").find("server: expected a mapping"), std::string::npos);
  EXPECT_NE(ErrorOf("metrics: {listen: nowhere}").find("metrics.listen: expected host:port"), std::string::npos);
  EXPECT_NE(ErrorOf("metrics: {peak_flops: -1}").find("metrics.peak_flops: must be between 0"), std::string::npos);
  EXPECT_NE(ErrorOf("metrics: {job_series_retention_seconds: -5}").find("metrics.job_series_retention_seconds"),
            std::string::npos);
  EXPECT_NE(ErrorOf("metrics: {peak_flops: fast}").find("metrics.peak_flops: expected a number"), std::string::npos);
  EXPECT_NE(ErrorOf("server: {max_threads: 4}").find("server.max_threads"), std::string::npos);
  EXPECT_NE(ErrorOf("server: {max_watchers_per_client: 0}").find("server.max_watchers_per_client"),
            std::string::npos);
  EXPECT_NE(ErrorOf("server: {max_threads: 16, reserved_threads: 14}")
                .find("server.reserved_threads: 14 leaves fewer than 3 of server.max_threads (16)"),
            std::string::npos);
  EXPECT_NE(ErrorOf("server: {shutdown_grace_seconds: 1e9}").find("server.shutdown_grace_seconds: must be between"),
            std::string::npos);
}

TEST(ConfigTest, TcpRequiresTlsAndToken) {
  const std::string e = ErrorOf("server: {tcp: {listen: 0.0.0.0:7443}}");
  EXPECT_NE(e.find("server.tcp.tls_cert_file: required"), std::string::npos) << e;
  EXPECT_NE(e.find("server.tcp.tls_key_file: required"), std::string::npos) << e;
  EXPECT_NE(e.find("server.tcp.auth_token_file: required"), std::string::npos) << e;
}

// The OpenAI API is off by default; on, it needs a token file and, having no TLS, a loopback
// address; its data directory defaults to <state_dir>/openai and its token file to server.tcp's.
TEST(ConfigTest, OpenAiApiIsOffByDefaultAndLoopbackOnlyWithAToken) {
  auto off = Parse("state_dir: /srv/o");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->server.openai_api.listen, "");
  EXPECT_EQ(off->server.openai_api.data_dir, "/srv/o/openai");

  std::string e = ErrorOf("server: {openai_api: {listen: 0.0.0.0:8080, auth_token_file: /etc/t}}");
  EXPECT_NE(e.find("server.openai_api.listen: '0.0.0.0:8080' is not a loopback address"),
            std::string::npos)
      << e;
  e = ErrorOf("server: {openai_api: {listen: 127.0.0.1:8080}}");
  EXPECT_NE(e.find("server.openai_api.auth_token_file: required"), std::string::npos) << e;
  e = ErrorOf("server: {openai_api: {listen: 127.0.0.1:8080, auth_token_file: t, colour: red}}");
  EXPECT_NE(e.find("server.openai_api.colour"), std::string::npos) << e;
  e = ErrorOf("server: {openai_api: {listen: 127.0.0.1:8080, auth_token_file: t}}");
  EXPECT_NE(e.find("server.openai_api.auth_token_file: must be an absolute path"),
            std::string::npos)
      << e;

  for (const char* host : {"127.0.0.1:0", "localhost:8080", "[::1]:8080", "127.1.2.3:9"}) {
    auto c = Parse(std::string("server: {openai_api: {listen: '") + host +
                   "', auth_token_file: /etc/t, max_upload_bytes: 1MiB}}");
    ASSERT_TRUE(c.ok()) << host << ": " << c.status().ToString();
    EXPECT_EQ(c->server.openai_api.max_upload_bytes, 1u << 20);
  }
  auto shared = Parse(
      "server: {tcp: {listen: 127.0.0.1:7443, tls_cert_file: /c, tls_key_file: /k, "
      "auth_token_file: /t}, "
      "openai_api: {listen: 127.0.0.1:8080}}");
  ASSERT_TRUE(shared.ok()) << shared.status().ToString();
  EXPECT_EQ(shared->server.openai_api.auth_token_file, "/t");
  // The effective configuration reads back as itself.
  auto again = Parse(ConfigToYaml(*shared));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ConfigToYaml(*again), ConfigToYaml(*shared));
}

// docs/security.md: the OpenAI API beyond loopback only with TLS (and a token); on a Unix socket,
// no token (the socket's mode grants access) and no TLS.
TEST(ConfigTest, OpenAiApiOnAUnixSocketOrBeyondLoopbackWithTls) {
  auto unix_socket = Parse("server: {openai_api: {listen: 'unix:/run/offloadd/openai.sock'}}");
  ASSERT_TRUE(unix_socket.ok()) << unix_socket.status().ToString();
  auto tls = Parse(
      "server: {openai_api: {listen: 0.0.0.0:8443, tls_cert_file: /c.pem, tls_key_file: /k.pem, "
      "auth_token_file: /t}}");
  ASSERT_TRUE(tls.ok()) << tls.status().ToString();
  EXPECT_EQ(tls->server.openai_api.tls_cert_file, "/c.pem");
  auto again = Parse(ConfigToYaml(*tls));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ConfigToYaml(*again), ConfigToYaml(*tls));

  const struct {
    std::string api, says;
  } cases[] = {
      {"listen: 'unix:run/openai.sock'", "a Unix socket's path must be absolute"},
      {"listen: 'unix:/" + std::string(100, 'a') + "'", "at most 88 bytes"},
      {"listen: 'unix:/run/offloadd/offloadd.sock'", "is server.unix_socket"},
      {"listen: 'unix:/run/o.sock', tls_cert_file: /c, tls_key_file: /k",
       "TLS is for a TCP listen"},
      {"listen: 0.0.0.0:8443, tls_cert_file: /c, auth_token_file: /t",
       "server.openai_api.tls_key_file: required with the other"},
      {"listen: 0.0.0.0:8443, tls_key_file: /k, auth_token_file: /t",
       "server.openai_api.tls_cert_file: required with the other"},
      {"listen: 0.0.0.0:8443, tls_cert_file: c.pem, tls_key_file: /k, auth_token_file: /t",
       "server.openai_api.tls_cert_file: must be an absolute path"},
      {"listen: 0.0.0.0:8443, tls_cert_file: /c, tls_key_file: /k",
       "server.openai_api.auth_token_file: required"},
      {"listen: 10.0.0.1:8080, auth_token_file: /t", "set tls_cert_file and tls_key_file"},
      {"listen: nowhere", "expected host:port or unix:/path"},
  };
  for (const auto& c : cases) {
    const std::string e = ErrorOf("server: {openai_api: {" + c.api + "}}");
    EXPECT_NE(e.find(c.says), std::string::npos) << c.api << ": " << e;
  }
}

// docs/security.md: TCP is never served without TLS or without a token, whichever one is missing.
TEST(ConfigTest, TcpWithoutAnyOneOfCertKeyOrTokenIsRefused) {
  const std::string cert = "tls_cert_file: /etc/offloadd/cert.pem";
  const std::string key = "tls_key_file: /etc/offloadd/key.pem";
  const std::string token = "auth_token_file: /etc/offloadd/token";
  const struct {
    std::string fields, missing;
  } cases[] = {{key + ", " + token, "tls_cert_file"},
               {cert + ", " + token, "tls_key_file"},
               {cert + ", " + key, "auth_token_file"},
               {cert + ", " + key + ", auth_token_file: ''", "auth_token_file"}};
  for (const auto& c : cases) {
    const std::string e = ErrorOf("server: {tcp: {listen: 127.0.0.1:7443, " + c.fields + "}}");
    EXPECT_NE(e.find("server.tcp." + c.missing + ": required when server.tcp.listen is set"), std::string::npos)
        << c.fields << " -> " << e;
  }
  EXPECT_TRUE(ParseConfig("server: {tcp: {listen: 127.0.0.1:7443, " + cert + ", " + key + ", " + token + "}}",
                          "test.yaml")
                  .ok());
}

TEST(ConfigTest, UnreachableDaemonIsRejected) {
  EXPECT_NE(ErrorOf("server: {unix_socket: ''}").find("would be unreachable"), std::string::npos);
}

TEST(ConfigTest, MalformedYamlNamesTheSource) {
  const std::string e = ErrorOf("server: {unix_socket: [\n");
  EXPECT_NE(e.find("test.yaml: not valid YAML"), std::string::npos) << e;
}

TEST(ConfigTest, MissingFileNamesThePath) {
  auto c = LoadConfigFile("/nonexistent/offloadd.yaml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/offloadd.yaml"), std::string::npos);
}

TEST(ConfigTest, EffectiveYamlRoundTrips) {
  auto c = Parse("server: {unix_socket_mode: '0640'}\nstorage: {directories: [/a/b]}\nmemory: {host_memory_limit: 3GiB}\n"
                 "metrics: {peak_flops: 312e12}\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto again = Parse(ConfigToYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ConfigToYaml(*c);
  EXPECT_EQ(ConfigToYaml(*again), ConfigToYaml(*c));
  EXPECT_EQ(again->server.unix_socket_mode, 0640u);
  EXPECT_EQ(again->memory.host_memory_limit, 3ull << 30);
  EXPECT_EQ(again->metrics.peak_flops, 312e12);
}

// The cancel grace period, the data-parallel group timeout and the liveness
// deadlines are settings, defaulted, range-checked with their key paths, and shown in the
// effective configuration.
TEST(ConfigTest, JobsLivenessSettings) {
  auto d = Parse("");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->jobs.cancel_grace_seconds, 30);
  EXPECT_EQ(d->jobs.group_timeout_seconds, 300);
  EXPECT_EQ(d->jobs.liveness.floor_seconds, 120);
  EXPECT_EQ(d->jobs.liveness.factor, 10);
  EXPECT_EQ(d->jobs.liveness.heartbeat_seconds, 5);
  const std::string effective = ConfigToYaml(*d);
  for (const char* key : {"cancel_grace_seconds: 30", "group_timeout_seconds: 300", "liveness:",
                          "floor_seconds: 120", "factor: 10", "heartbeat_seconds: 5"}) {
    EXPECT_NE(effective.find(key), std::string::npos) << key << " missing from\n" << effective;
  }

  auto c = Parse("jobs: {cancel_grace_seconds: 0.5, group_timeout_seconds: 20, "
                 "liveness: {floor_seconds: 2, factor: 4, heartbeat_seconds: 0.25}}\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->jobs.cancel_grace_seconds, 0.5);
  EXPECT_EQ(c->jobs.group_timeout_seconds, 20);
  EXPECT_EQ(c->jobs.liveness.floor_seconds, 2);
  EXPECT_EQ(c->jobs.liveness.factor, 4);
  EXPECT_EQ(c->jobs.liveness.heartbeat_seconds, 0.25);
  auto again = Parse(ConfigToYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ConfigToYaml(*again), ConfigToYaml(*c));

  EXPECT_NE(ErrorOf("jobs: {cancel_grace_seconds: -1}").find("jobs.cancel_grace_seconds"), std::string::npos);
  EXPECT_NE(ErrorOf("jobs: {group_timeout_seconds: 0}").find("jobs.group_timeout_seconds"), std::string::npos);
  EXPECT_NE(ErrorOf("jobs: {liveness: {factor: 0.5}}").find("jobs.liveness.factor"), std::string::npos);
  EXPECT_NE(ErrorOf("jobs: {liveness: {heartbeat_seconds: fast}}").find("jobs.liveness.heartbeat_seconds"),
            std::string::npos);
  EXPECT_NE(ErrorOf("jobs: {liveness: {floor: 3}}").find("jobs.liveness.floor"), std::string::npos);
}

// Whitespace at either end and control characters survive the round trip (fuzz regression
// daemon_config/trailing-blanks-in-path: yaml-cpp wrote "/srv/offloadd add    \r" unquoted).
TEST(ConfigTest, EffectiveYamlKeepsBlanksAndControlCharacters) {
  auto c = Parse("state_dir: \"/var/lib/x\\r\"\nstorage: {directories: [\"/srv/a b   \", \"/trail\\r\", \"/tab\\tin\"]}\n");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->storage.directories.size(), 3u);
  EXPECT_EQ(c->state_dir, "/var/lib/x\r");
  auto again = Parse(ConfigToYaml(*c));
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ConfigToYaml(*c);
  EXPECT_EQ(again->state_dir, "/var/lib/x\r");
  EXPECT_EQ(again->storage.directories[0].path, "/srv/a b   ");
  EXPECT_EQ(again->storage.directories[1].path, "/trail\r");
  EXPECT_EQ(again->storage.directories[2].path, "/tab\tin");
  EXPECT_EQ(ConfigToYaml(*again), ConfigToYaml(*c));
}

}  // namespace
}  // namespace offloadd::daemon
