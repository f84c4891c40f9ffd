// Per-client limits on active jobs and WatchJob streams (issue #18, daemon/server/client_quota.h).
#include "daemon/server/client_quota.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace offloadd::daemon {
namespace {

TEST(ClientKeyTest, TcpClientsAreTheirAddressWithoutThePort) {
  EXPECT_EQ(ClientKey("ipv4:127.0.0.1:51234"), "ipv4:127.0.0.1");
  EXPECT_EQ(ClientKey("ipv4:127.0.0.1:40000"), "ipv4:127.0.0.1");  // another connection, same client
  EXPECT_EQ(ClientKey("ipv6:[::1]:8443"), "ipv6:[::1]");
  EXPECT_EQ(ClientKey("ipv6:[::1]"), "ipv6:[::1]");  // no port: kept whole
  EXPECT_EQ(ClientKey("unix:/run/offloadd/offloadd.sock"), "unix");
  EXPECT_EQ(ClientKey("unix:"), "unix");
}

TEST(ClientQuotaTest, WatchersAreCountedPerClientAndReleasedWithTheStream) {
  ClientQuota q(10, 2);
  auto a = q.AcquireWatcher("ipv4:10.0.0.1");
  auto b = q.AcquireWatcher("ipv4:10.0.0.1");
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = q.AcquireWatcher("ipv4:10.0.0.1");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("client ipv4:10.0.0.1 has 2 WatchJob streams open, the "
                                      "server.max_watchers_per_client limit"),
            std::string::npos)
      << c.status().message();
  EXPECT_TRUE(q.AcquireWatcher("ipv4:10.0.0.2").ok()) << "another client has its own quota";
  { auto gone = std::move(*a); }  // the stream ends
  EXPECT_EQ(q.watchers("ipv4:10.0.0.1"), 1);
  EXPECT_TRUE(q.AcquireWatcher("ipv4:10.0.0.1").ok());
}

TEST(ClientQuotaTest, OnlyActiveJobsAndPendingCreationsCount) {
  ClientQuota q(2, 10);
  std::set<std::string> active;
  auto is_active = [&](const std::string& id) { return active.count(id) > 0; };
  ASSERT_TRUE(q.Reserve("unix", is_active).ok());
  q.Commit("unix", "job-1");
  active.insert("job-1");
  ASSERT_TRUE(q.Reserve("unix", is_active).ok());  // pending: not created yet
  const Status third = q.Reserve("unix", is_active);
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.message().find("client unix has 2 active jobs (queued, running or paused), the "
                                 "server.max_active_jobs_per_client limit"),
            std::string::npos)
      << third.message();
  q.Release("unix");  // the pending creation failed
  ASSERT_TRUE(q.Reserve("unix", is_active).ok());
  q.Commit("unix", "job-2");
  active.insert("job-2");
  EXPECT_FALSE(q.Reserve("unix", is_active).ok());
  active.erase("job-1");  // finished, failed or cancelled
  EXPECT_TRUE(q.Reserve("unix", is_active).ok());
}

}  // namespace
}  // namespace offloadd::daemon
