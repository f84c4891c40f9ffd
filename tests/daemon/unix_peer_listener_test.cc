#include "daemon/server/unix_peer_listener.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include <gtest/gtest.h>

#include "offloadd/v1/job_service.grpc.pb.h"

namespace offloadd::daemon {
namespace {

TEST(PeerCredentialsTest, AConnectionsFdNamesItsUser) {
  PeerCredentials peers;
  peers.Set(7, PeerCred{123, 1000, 100});
  auto cred = peers.Lookup("fd:7");
  ASSERT_TRUE(cred.has_value());
  EXPECT_EQ(cred->uid, 1000u);
  EXPECT_EQ(cred->pid, 123);
  EXPECT_EQ(peers.ClientFor("fd:7"), "unix:uid=1000");
  // A reused fd number is the newer connection's.
  peers.Set(7, PeerCred{456, 0, 0});
  EXPECT_EQ(peers.ClientFor("fd:7"), "unix:uid=0");
}

TEST(PeerCredentialsTest, OtherPeersKeepTheirAddressKey) {
  PeerCredentials peers;
  peers.Set(7, PeerCred{1, 1000, 100});
  EXPECT_FALSE(peers.Lookup("fd:8").has_value());
  EXPECT_FALSE(peers.Lookup("fd:7x").has_value());
  EXPECT_FALSE(peers.Lookup("fd:").has_value());
  EXPECT_FALSE(peers.Lookup("ipv4:127.0.0.1:7").has_value());
  EXPECT_EQ(peers.ClientFor("ipv4:10.0.0.7:51234"), "ipv4:10.0.0.7");
  EXPECT_EQ(peers.ClientFor("unix:/run/offloadd.sock"), "unix");
  EXPECT_EQ(peers.ClientFor("fd:8"), "fd:8");  // unknown: kept whole, never merged with a user
}

// A real connection through the listener: it is recorded with this process's credentials and
// served by the gRPC server it was handed to (a call reaches the registered service over it).
TEST(UnixPeerListenerTest, RecordsTheConnectingProcessAndHandsTheConnectionToGrpc) {
  char tmpl[] = "/tmp/offloadd-peer-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/s";
  auto peers = std::make_shared<PeerCredentials>();
  auto listener = UnixPeerListener::Bind(path, peers);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  offloadd::v1::JobService::Service service;  // every method answers UNIMPLEMENTED
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*listener)->Start(server.get());

  auto channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ((*listener)->accepted(), 1);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  offloadd::v1::Job job;
  const grpc::Status status =
      offloadd::v1::JobService::NewStub(channel)->GetJob(&context, offloadd::v1::GetJobRequest(), &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();

  // The recorded entry is this process (the client runs in it).
  bool found = false;
  for (int fd = 0; fd < 4096 && !found; ++fd) {
    if (auto c = peers->Lookup("fd:" + std::to_string(fd))) {
      found = true;
      EXPECT_EQ(c->pid, getpid());
      EXPECT_EQ(c->uid, getuid());
      EXPECT_EQ(c->gid, getgid());
    }
  }
  EXPECT_TRUE(found);
  (*listener)->Stop();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Wait();
  unlink(path.c_str());
  rmdir(tmpl);
}

TEST(UnixPeerListenerTest, APathTooLongForASocketIsRefused) {
  auto listener = UnixPeerListener::Bind("/tmp/" + std::string(200, 'x'), std::make_shared<PeerCredentials>());
  ASSERT_FALSE(listener.ok());
  EXPECT_NE(listener.status().message().find("107 bytes"), std::string::npos) << listener.status().ToString();
}

}  // namespace
}  // namespace offloadd::daemon
