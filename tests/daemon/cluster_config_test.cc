// The daemon config's cluster: section (daemon/config/cluster_config.cc): peers, mutual TLS files,
// the token, and jobs.wait_for_lost_host_seconds, refused by name while it is not built.
#include "daemon/config/cluster_config.h"

#include <gtest/gtest.h>

#include "daemon/config/config.h"

namespace offloadd::daemon {
namespace {

std::string ErrorOf(const std::string& yaml) {
  auto c = ParseConfig(yaml, "<test>");
  return c.ok() ? std::string("(accepted)") : std::string(c.status().message());
}

constexpr const char* kTls =
    "tls_cert_file: /etc/c.pem, tls_key_file: /etc/k.pem, tls_ca_file: /etc/ca.pem, "
    "token_file: /etc/t";

TEST(ClusterConfigTest, OffByDefaultAndNamedAfterTheHost) {
  auto c = ParseConfig("", "<test>");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->cluster.listen.empty());
  EXPECT_TRUE(c->cluster.peers.empty());
  EXPECT_FALSE(c->cluster.name.empty());
  EXPECT_EQ(c->cluster.lost_host_seconds, 10);
  EXPECT_EQ(c->jobs.wait_for_lost_host_seconds, 0);
}

TEST(ClusterConfigTest, ReadsPeersAndPrintsThem) {
  auto c = ParseConfig(std::string("cluster: {name: a, advertise_address: 10.0.0.1, ") + kTls +
                           ", listen: 0.0.0.0:7070, lost_host_seconds: 4, peers: [{name: b, "
                           "address: '10.0.0.2:7070'}, {name: c, address: 'c.lan:7070'}]}",
                       "<test>");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->cluster.peers.size(), 2u);
  EXPECT_EQ(c->cluster.peers[1].name, "c");
  EXPECT_EQ(c->cluster.peers[1].address, "c.lan:7070");
  EXPECT_EQ(c->cluster.lost_host_seconds, 4);
  // The effective configuration parses back to the same.
  auto again = ParseConfig(ConfigToYaml(*c), "<effective>");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << ConfigToYaml(*c);
  EXPECT_EQ(again->cluster.peers[0].address, "10.0.0.2:7070");
  EXPECT_EQ(again->cluster.advertise_address, "10.0.0.1");
}

TEST(ClusterConfigTest, PeersNeedMutualTlsTheTokenAndAnAdvertisedAddress) {
  const std::string e = ErrorOf("cluster: {peers: [{name: b, address: 'b:7070'}]}");
  for (const char* key : {"cluster.tls_cert_file: required", "cluster.tls_key_file: required",
                          "cluster.tls_ca_file: required", "cluster.token_file: required",
                          "cluster.advertise_address: required"}) {
    EXPECT_NE(e.find(key), std::string::npos) << key << "\n" << e;
  }
}

TEST(ClusterConfigTest, BadPeersAreNamedByIndex) {
  const std::string e = ErrorOf(std::string("cluster: {name: a, advertise_address: x, ") + kTls +
                                ", peers: [{name: a, address: 'b:1'}, {name: c, address: c}, "
                                "{address: 'd:0'}]}");
  EXPECT_NE(e.find("cluster.peers[0].name: 'a' names another host"), std::string::npos) << e;
  EXPECT_NE(e.find("cluster.peers[1].address: expected host:port, got 'c'"), std::string::npos)
      << e;
  EXPECT_NE(e.find("cluster.peers[2].name: required"), std::string::npos) << e;
  EXPECT_NE(e.find("cluster.peers[2].address: expected host:port, got 'd:0'"), std::string::npos)
      << e;
  EXPECT_NE(ErrorOf("cluster: {peers: [{name: e, adress: 'e:1'}]}")
                .find("cluster.peers[0].adress: unknown key (known: name, address)"),
            std::string::npos);
  EXPECT_NE(ErrorOf(std::string("cluster: {listen: nowhere, ") + kTls + "}")
                .find("cluster.listen: expected host:port, got 'nowhere'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("cluster: {listen: ':1', tls_cert_file: /c, tls_key_file: /k, tls_ca_file: "
                    "/ca, token_file: t}")
                .find("cluster.token_file: must be an absolute path"),
            std::string::npos);
}

// Accepted, it would have to act (wait, then resume from the last committed checkpoint): it is not
// built, so it is refused by name rather than ignored.
TEST(ClusterConfigTest, WaitingForALostHostIsRefusedByName) {
  const std::string e = ErrorOf("jobs: {wait_for_lost_host_seconds: 60}");
  EXPECT_NE(e.find("jobs.wait_for_lost_host_seconds: waiting for a lost host and resuming is not "
                   "built"),
            std::string::npos)
      << e;
  EXPECT_EQ(ErrorOf("jobs: {wait_for_lost_host_seconds: 0}"), "(accepted)");
}

}  // namespace
}  // namespace offloadd::daemon
