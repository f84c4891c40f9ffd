// The shape profile's file (job/shape_profile.h): written and read back field for field,
// listed newest first, and every unusable file refused naming what is wrong.
#include "job/shape_profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "common/file.h"

namespace offloadd::trainer {
namespace {

class ShapeProfileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/shape_profile_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(dir_); }

  static ShapeProfile Sample(int64_t batch, const std::string& at) {
    ShapeProfile p;
    p.gpu = "NVIDIA H200";
    p.model = "llama/22 layers/1100048384 params/0123456789abcdef";
    p.batch = batch;
    p.seq = 1024;
    p.dtype = "BFloat16";
    p.key = ShapeProfileKey(p.gpu, p.model, p.batch, p.seq, p.dtype);
    p.profiled_step = 2;
    p.gpu_seconds = 0.25;
    p.peak_reserved_bytes = int64_t{5} << 30;
    p.peak_allocated_bytes = int64_t{4} << 30;
    p.workspace_bytes = int64_t{3} << 29;
    p.measured_at = at;
    for (const char* name : {"embedding", "model.layers.0", "head"}) {
      BlockProfile b;
      b.name = name;
      b.mode = "recompute";
      b.forward_s = 0.003;
      b.backward_s = 0.009;
      b.recompute_s = 0.003;
      b.keep_bytes = int64_t{1310} << 20;
      b.recompute_bytes = int64_t{128} << 20;
      b.forward_transient_bytes = int64_t{700} << 20;
      b.backward_transient_bytes = int64_t{2100} << 20;
      p.blocks.push_back(b);
    }
    return p;
  }

  void WriteRaw(const std::string& key, const std::string& text) {
    ASSERT_TRUE(MakeDirs(JoinPath(dir_, kShapeProfileDir)).ok());
    std::ofstream(ShapeProfilePath(dir_, key)) << text;
  }

  std::string dir_;
};

TEST_F(ShapeProfileTest, RoundTripsEveryField) {
  const ShapeProfile p = Sample(32, "2026-11-26T15:00:00Z");
  EXPECT_EQ(p.key, "NVIDIA H200 | llama/22 layers/1100048384 params/0123456789abcdef | 32x1024 BFloat16");
  ASSERT_TRUE(WriteShapeProfile(dir_, p).ok());
  auto r = ReadShapeProfile(ShapeProfilePath(dir_, p.key));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(ShapeProfileJson(*r), ShapeProfileJson(p));
  ASSERT_EQ(r->blocks.size(), 3u);
  EXPECT_EQ(r->blocks[1].name, "model.layers.0");
  EXPECT_EQ(r->blocks[1].backward_transient_bytes, int64_t{2100} << 20);
  EXPECT_EQ(r->workspace_bytes, int64_t{3} << 29);
}

TEST_F(ShapeProfileTest, PathsDifferPerKeyAndStayInsideTheDirectory) {
  const std::string a = ShapeProfilePath(dir_, Sample(8, "x").key);
  const std::string b = ShapeProfilePath(dir_, Sample(32, "x").key);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.rfind(dir_ + "/shapes/", 0), 0u) << a;
  EXPECT_EQ(a.size(), dir_.size() + std::string("/shapes/").size() + 16 + 5) << a;
}

TEST_F(ShapeProfileTest, ListsNewestFirstAndNamesUnreadableFiles) {
  ASSERT_TRUE(WriteShapeProfile(dir_, Sample(8, "2026-11-25T10:00:00Z")).ok());
  ASSERT_TRUE(WriteShapeProfile(dir_, Sample(32, "2026-11-26T10:00:00Z")).ok());
  WriteRaw("broken", "{not json");
  std::vector<std::string> problems;
  const auto list = ListShapeProfiles(dir_, &problems);
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].batch, 32);
  EXPECT_EQ(list[1].batch, 8);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("not a shape profile"), std::string::npos) << problems[0];
  EXPECT_TRUE(ListShapeProfiles(dir_ + "/absent", nullptr).empty());
}

TEST_F(ShapeProfileTest, RefusesWhatIsNotAMeasuredProfile) {
  const ShapeProfile good = Sample(8, "2026-11-26T10:00:00Z");
  EXPECT_EQ(ReadShapeProfile(ShapeProfilePath(dir_, good.key)).status().code(), StatusCode::kNotFound);
  const nlohmann::json base = nlohmann::json::parse(ShapeProfileJson(good));
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> damage;
    const char* says;
  } cases[] = {
      {"missing field", [](nlohmann::json& j) { j.erase("workspace_bytes"); }, "workspace_bytes"},
      {"negative time", [](nlohmann::json& j) { j["blocks"][1]["forward_s"] = -1.0; }, "model.layers.0 has a negative"},
      {"no blocks", [](nlohmann::json& j) { j["blocks"] = nlohmann::json::array(); }, "no blocks"},
      {"key of another shape", [](nlohmann::json& j) { j["batch"] = 16; }, "its key does not match"},
      {"wrong type", [](nlohmann::json& j) { j["seq"] = "long"; }, "not a shape profile"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = base;
    c.damage(j);
    WriteRaw(good.key, j.dump());
    auto r = ReadShapeProfile(ShapeProfilePath(dir_, good.key));
    ASSERT_FALSE(r.ok()) << c.what;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(std::string(r.status().message()).find(c.says), std::string::npos)
        << c.what << ": " << r.status().message();
  }
}

}  // namespace
}  // namespace offloadd::trainer
