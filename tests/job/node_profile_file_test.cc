// job/node_profile_file.h: the node profile's per-store-directory rates survive its JSON file,
// and the striped rate counts each device once.
#include "job/node_profile_file.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>

namespace offloadd::trainer {
namespace {

NodeProfile Measured() {
  NodeProfile p;
  p.key = "node";
  p.host_bytes_per_s = 1e11;
  p.cpu_params_per_s = 4e9;
  p.threads = 15;
  p.kernel = "avx512";
  p.measured_at = "2026-11-28T00:00:00Z";
  return p;
}

TEST(NodeProfileFileTest, StripedRatesSumTheDevicesEachOnce) {
  NodeProfile p = Measured();
  p.stores = {{"/nvme0/a", 6e9, 5e9, true, 1},
              {"/nvme1/a", 5e9, 4e9, true, 2},
              {"/nvme0/b", 3e9, 2e9, false, 1}};
  SumStoreRates(&p);
  EXPECT_EQ(p.store_dir, "/nvme0/a");
  // /nvme0/b shares /nvme0/a's device: the faster of the two counts, once.
  EXPECT_DOUBLE_EQ(p.store_read_bytes_per_s, 11e9);
  EXPECT_DOUBLE_EQ(p.store_write_bytes_per_s, 9e9);
  EXPECT_FALSE(p.store_direct_io);  // not every directory allows O_DIRECT
  NodeProfile none = Measured();
  SumStoreRates(&none);
  EXPECT_EQ(none.store_read_bytes_per_s, 0);
  EXPECT_TRUE(none.store_dir.empty());
}

TEST(NodeProfileFileTest, EachStoreDirectorysRatesSurviveTheFile) {
  NodeProfile p = Measured();
  p.stores = {{"/nvme0/a", 6e9, 5e9, true, 7}, {"/nvme1/a", 5e9, 4e9, false, 8}};
  SumStoreRates(&p);
  const std::string path = ::testing::TempDir() + "/node-profile-stores.json";
  std::ofstream(path, std::ios::trunc) << NodeProfileJson(p);
  auto back = ReadNodeProfile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->stores.size(), 2u);
  EXPECT_EQ(back->stores[1].dir, "/nvme1/a");
  EXPECT_DOUBLE_EQ(back->stores[1].read_bytes_per_s, 5e9);
  EXPECT_DOUBLE_EQ(back->stores[1].write_bytes_per_s, 4e9);
  EXPECT_FALSE(back->stores[1].direct_io);
  EXPECT_EQ(back->stores[0].device, 7u);
  EXPECT_DOUBLE_EQ(back->store_read_bytes_per_s, 11e9);
  // An older profile without "stores" still reads (its single store fields).
  std::ofstream(path, std::ios::trunc)
      << R"({"key": "k", "host_bytes_per_s": 1e11, "cpu_params_per_s": 4e9, "threads": 1, "kernel": "scalar",
            "h2d_bytes_per_s": 0, "d2h_bytes_per_s": 0, "both_bytes_per_s": 0, "measure_seconds": 1,
            "measured_at": "x", "store_dir": "/s", "store_read_bytes_per_s": 2e9})";
  back = ReadNodeProfile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->stores.empty());
  EXPECT_DOUBLE_EQ(back->store_read_bytes_per_s, 2e9);
}

}  // namespace
}  // namespace offloadd::trainer
