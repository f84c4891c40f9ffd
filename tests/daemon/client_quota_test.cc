// Per-client limits on active jobs and WatchJob streams (daemon/server/client_quota.h).
#include "daemon/server/client_quota.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <set>
#include <string>
#include <thread>

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

// CreateJob calls (waiting for a validation slot or validating) and WatchJob
// streams hold a server thread each. One client may hold at most its share of the threads left
// after the reserve for job control and health, and at most max_creates_per_client CreateJobs.
TEST(ClientQuotaTest, HeldCallsAreBoundedPerClientAndOverall) {
  const ClientQuotaLimits limits =
      QuotaLimitsFor(1000, 1024, /*max_threads=*/16, /*reserved_threads=*/0);
  EXPECT_EQ(limits.max_held_calls, 12u) << "16 less 2 reserved, less 2 for gRPC's pollers";
  EXPECT_EQ(limits.max_held_calls_per_client, 6u);
  EXPECT_EQ(limits.max_creates_per_client, 6u);
  EXPECT_EQ(QuotaLimitsFor(1000, 1024, 4096, 0).max_held_calls, 4096u - 64 - 2);
  EXPECT_EQ(QuotaLimitsFor(1000, 1024, 64, 10).max_held_calls, 52u);

  ClientQuota q(limits);
  std::vector<ClientQuota::Lease> held;
  for (int i = 0; i < 6; ++i) {
    auto c = q.AcquireCreate("token:mallory");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    held.push_back(std::move(*c));
  }
  auto seventh = q.AcquireCreate("token:mallory");
  ASSERT_EQ(seventh.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(
      seventh.status().message().find("client token:mallory has 6 CreateJob calls in progress"),
      std::string::npos)
      << seventh.status().ToString();
  held.pop_back();
  held.pop_back();
  for (int i = 0; i < 2; ++i) {
    auto w = q.AcquireWatcher("token:mallory");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    held.push_back(std::move(*w));
  }
  auto watch = q.AcquireWatcher("token:mallory");
  ASSERT_EQ(watch.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(watch.status().message().find(
                "client token:mallory has 6 CreateJob and WatchJob calls in progress, "
                "its share (6"),
            std::string::npos)
      << watch.status().ToString();
  // Another client has its own share; all together stop at 12, leaving the reserve.
  for (int i = 0; i < 6; ++i) {
    auto w = q.AcquireWatcher(i < 3 ? "token:bob" : "token:carol");
    ASSERT_TRUE(w.ok()) << i << ": " << w.status().ToString();
    held.push_back(std::move(*w));
  }
  auto over = q.AcquireCreate("token:alice");
  ASSERT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("server.reserved_threads"), std::string::npos)
      << over.status().ToString();
  EXPECT_EQ(q.held_calls(), 12);
  held.clear();
  EXPECT_EQ(q.held_calls(), 0);
  EXPECT_TRUE(q.AcquireCreate("token:alice").ok());
}

TEST(ClientQuotaTest, ValidationSlotsAreSharedAmongClients) {
  ClientQuotaLimits limits;
  limits.validation_slots = 3;
  limits.validation_slots_per_client = 2;
  ClientQuota q(limits);
  const auto soon = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(10); };
  auto a1 = q.AcquireValidation("a", {}, soon());
  auto a2 = q.AcquireValidation("a", {}, soon());
  ASSERT_TRUE(a1.ok() && a2.ok());
  // A third for client a waits although a slot is free: a is at its share.
  const auto t0 = std::chrono::steady_clock::now();
  auto a3 = q.AcquireValidation("a", {}, t0 + std::chrono::milliseconds(300));
  EXPECT_EQ(a3.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(a3.status().message().find("at most 2 for one client"), std::string::npos)
      << a3.status().ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  // Client b is not held up by a's waiting call.
  std::atomic<bool> b_got{false};
  std::optional<ClientQuota::Lease> a4;
  std::thread a_waits([&] {
    auto got = q.AcquireValidation("a", {}, soon());
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_TRUE(b_got.load()) << "a waited behind its share, b went first";
    a4.emplace(std::move(*got));
  });
  auto b1 = q.AcquireValidation("b", {}, soon());
  ASSERT_TRUE(b1.ok()) << b1.status().ToString();
  b_got = true;
  EXPECT_EQ(q.validations(), 3);
  { auto done = std::move(*a1); }  // one of a's validations ends: its waiting call gets the slot
  a_waits.join();
  EXPECT_EQ(q.validations(), 3);
  // A waiting call whose client went away gives up (CANCELLED) without taking a slot.
  std::atomic<bool> gone{false};
  std::thread cancel([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    gone = true;
  });
  auto c1 = q.AcquireValidation(
      "c", [&] { return gone.load(); }, soon());
  cancel.join();
  EXPECT_EQ(c1.status().code(), StatusCode::kCancelled) << c1.status().ToString();
}

// The active jobs of the store count after a restart.
TEST(ClientQuotaTest, AdoptedJobsCountLikeCreatedOnes) {
  ClientQuota q(1, 10);
  q.Adopt("unix:uid=1000", "job-1");
  const Status s = q.Reserve("unix:uid=1000", [](const std::string&) { return true; });
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_TRUE(q.Reserve("unix:uid=1000", [](const std::string&) { return false; }).ok())
      << "an adopted job that ended no longer counts";
}

}  // namespace
}  // namespace offloadd::daemon
