#include "storage/store_flags.h"

#include <gtest/gtest.h>

namespace offloadd::storage {
namespace {

TEST(StoreFlagsTest, ParsesBothSpellingsAndWeights) {
  auto f =
      ParseStoreFlags({"--dir=/nvme0/s", "--dir", "/nvme1/s:2.5", "--block-size=4MiB",
                       "--queue-depth", "64", "--io-engine=threads", "--direct-io=off",
                       "--control-fd=3", "--metrics-listen=127.0.0.1:0", "--log-level=warning"});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->store.directories.size(), 2u);
  EXPECT_EQ(f->store.directories[0].path, "/nvme0/s");
  EXPECT_EQ(f->store.directories[0].weight, 1.0);
  EXPECT_EQ(f->store.directories[1].path, "/nvme1/s");
  EXPECT_EQ(f->store.directories[1].weight, 2.5);
  EXPECT_EQ(f->store.block_size, 4u << 20);
  EXPECT_EQ(f->store.queue_depth, 64u);
  EXPECT_EQ(f->store.io_engine, IoEngineChoice::kThreads);
  EXPECT_EQ(f->store.direct_io, DirectIoMode::kOff);
  EXPECT_EQ(f->control_fd, 3);
  EXPECT_EQ(f->metrics_listen, "127.0.0.1:0");
  EXPECT_EQ(f->log_level, LogSeverity::kWarning);
}

TEST(StoreFlagsTest, RejectsBadInputNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string mention;
  };
  for (const auto& c : std::vector<Case>{
           {{"--dir=/a", "--bogus=1"}, "--bogus"},
           {{"--dir=/a", "--queue-depth=abc"}, "--queue-depth"},
           {{"--dir=/a", "--queue-depth=0"}, "aio.queue_depth"},
           {{"--dir=/a", "--block-size=1000"}, "aio.block_size"},
           {{"--dir=/a", "--block-size=lots"}, ""},
           {{"--dir=/a", "--io-engine=spdk"}, "--io-engine"},
           {{"--dir=/a", "--direct-io=maybe"}, "--direct-io"},
           {{"--dir=/a", "--log-level=loud"}, "--log-level"},
           {{"--dir=/a", "--control-fd"}, "missing value"},
           {{}, "directories"},
       }) {
    auto f = ParseStoreFlags(c.args);
    ASSERT_FALSE(f.ok()) << c.args.back();
    EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(f.status().message().find(c.mention), std::string::npos) << f.status().message();
  }
}

TEST(StoreFlagsTest, OptionsRoundTripThroughFlags) {
  StoreOptions o;
  o.directories = {{"/nvme0/offloadd", 1.0}, {"/mnt/with:colon", 0.75}};
  o.block_size = 2 << 20;
  o.queue_depth = 16;
  o.io_engine = IoEngineChoice::kIoUring;
  o.direct_io = DirectIoMode::kOn;
  auto f = ParseStoreFlags(ToStoreFlags(o));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_EQ(f->store.directories.size(), 2u);
  EXPECT_EQ(f->store.directories[1].path, "/mnt/with:colon");
  EXPECT_EQ(f->store.directories[1].weight, 0.75);
  EXPECT_EQ(f->store.block_size, o.block_size);
  EXPECT_EQ(f->store.queue_depth, o.queue_depth);
  EXPECT_EQ(f->store.io_engine, o.io_engine);
  EXPECT_EQ(f->store.direct_io, o.direct_io);
}

}  // namespace
}  // namespace offloadd::storage
