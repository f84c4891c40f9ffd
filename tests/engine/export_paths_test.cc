// Model::Export and the paths it touches: it stays inside the allowed roots whatever
// symlinks the model or output directory holds (item 3), and fsyncs what it writes (item 10).
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "common/file.h"
#include "common/safe_path.h"
#include "engine/model.h"
#include "tests/engine/tiny_model.h"

namespace offloadd::engine {
namespace {

using testing::TinyArch;
using testing::WriteTinyModel;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool IsSymlink(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
}

std::string FdPath(int fd) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// base/root is the allowed root holding the model (root/model); base/outside is not allowed.
class ExportPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char templ[] = "/tmp/export_paths_test.XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    char real[PATH_MAX];
    ASSERT_NE(::realpath(templ, real), nullptr);
    base_ = real;
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    model_ = root_ + "/model";
    ASSERT_TRUE(MakeDirs(outside_).ok());
    WriteTinyModel(model_, TinyArch::kLlama, /*tied=*/false);
    std::ofstream(outside_ + "/secret") << "secret";
    std::ofstream(outside_ + "/victim") << "victim";
  }
  void TearDown() override {
    SetAllowedRoots({});
    SetFsyncObserverForTesting(nullptr);
    ASSERT_TRUE(RemoveTree(base_).ok());
  }
  std::unique_ptr<Model> Load() {
    auto m = Model::Load(model_);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }

  std::string base_, root_, outside_, model_;
};

TEST_F(ExportPathsTest, SymlinkInTheModelDirectoryLeadingOutOfTheRootsIsNotCopied) {
  SetAllowedRoots({root_});
  ASSERT_EQ(::symlink((outside_ + "/secret").c_str(), (model_ + "/tokenizer.json").c_str()), 0);
  auto m = Load();
  ASSERT_NE(m, nullptr);
  const std::string out = root_ + "/out";
  Status st = m->Export(out);
  ASSERT_FALSE(st.ok()) << "the export copied a file from outside the allowed roots";
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find(model_ + "/tokenizer.json"), std::string::npos) << st.ToString();
  EXPECT_NE(Slurp(out + "/tokenizer.json"), "secret");
}

TEST_F(ExportPathsTest, SymlinksInTheOutputDirectoryAreReplacedNotWrittenThrough) {
  for (bool confined : {true, false}) {
    SCOPED_TRACE(confined ? "confined" : "no roots set");
    SetAllowedRoots(confined ? std::vector<std::string>{root_} : std::vector<std::string>{});
    std::ofstream(model_ + "/tokenizer.json") << "{}";
    const std::string out = root_ + (confined ? "/out1" : "/out2");
    ASSERT_TRUE(MakeDirs(out).ok());
    const std::string victim = outside_ + "/victim";
    for (const char* name : {"config.json", "tokenizer.json", "model.safetensors",
                             "model.safetensors.tmp"}) {
      ASSERT_EQ(::symlink(victim.c_str(), (out + "/" + name).c_str()), 0) << name;
    }
    auto m = Load();
    ASSERT_NE(m, nullptr);
    Status st = m->Export(out);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(Slurp(victim), "victim") << "the export wrote through a symlink";
    for (const char* name : {"config.json", "tokenizer.json", "model.safetensors"}) {
      EXPECT_FALSE(IsSymlink(out + "/" + name)) << name;
    }
    EXPECT_EQ(Slurp(out + "/config.json"), Slurp(model_ + "/config.json"));
    EXPECT_TRUE(Model::Load(out).ok());
  }
}

TEST_F(ExportPathsTest, OutputDirectoryReplacedBySymlinkIsRefused) {
  SetAllowedRoots({root_});
  ASSERT_TRUE(MakeDirs(outside_ + "/dir").ok());
  const std::string out = root_ + "/out";
  ASSERT_EQ(::symlink((outside_ + "/dir").c_str(), out.c_str()), 0);
  auto m = Load();
  ASSERT_NE(m, nullptr);
  Status st = m->Export(out);
  ASSERT_FALSE(st.ok()) << "the export wrote through a symlinked output directory";
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  EXPECT_NE(st.message().find(out), std::string::npos) << st.ToString();
  EXPECT_FALSE(PathExists(outside_ + "/dir/config.json"));
  EXPECT_FALSE(PathExists(outside_ + "/dir/model.safetensors"));
}

TEST_F(ExportPathsTest, EveryExportedFileAndTheDirectoryAreFsynced) {
  std::ofstream(model_ + "/tokenizer.json") << "{}";
  std::ofstream(model_ + "/generation_config.json") << "{}";
  auto m = Load();
  ASSERT_NE(m, nullptr);
  std::set<std::string> synced;
  SetFsyncObserverForTesting([&](int fd) { synced.insert(FdPath(fd)); });
  const std::string out = root_ + "/out";
  ASSERT_TRUE(m->Export(out).ok());
  SetFsyncObserverForTesting(nullptr);
  EXPECT_TRUE(synced.count(out)) << "the output directory was not fsync'd";
  for (const char* name : {"model.safetensors", "config.json", "tokenizer.json",
                           "generation_config.json"}) {
    ASSERT_TRUE(PathExists(out + "/" + name)) << name;
    // Written under a temporary name, fsync'd, then renamed.
    bool found = synced.count(out + "/" + name) > 0;
    for (const auto& p : synced) found |= p.rfind(out + "/." + name + ".tmp-", 0) == 0;
    EXPECT_TRUE(found) << name << " was not fsync'd; fsync'd: " << ::testing::PrintToString(synced);
  }
}

}  // namespace
}  // namespace offloadd::engine
