#include "common/file_identity.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <future>
#include <thread>

#include "common/safe_path.h"

namespace offloadd {
namespace {

constexpr uid_t kNobody = 65534;

uid_t FsUid() { return static_cast<uid_t>(::syscall(SYS_setfsuid, static_cast<uid_t>(-1))); }

// With the daemon running as root, a job's files are opened with its user's
// rights, so a hard link (or any path) to a file that user cannot read is refused by the kernel,
// and what the job writes belongs to that user. base/ is the allowed root.
class FileIdentityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "switching to another user's rights needs root";
    char templ[] = "/tmp/file_identity_test.XXXXXX";
    ASSERT_NE(::mkdtemp(templ), nullptr);
    char real[PATH_MAX];
    ASSERT_NE(::realpath(templ, real), nullptr);
    base_ = real;
    ASSERT_EQ(::chmod(base_.c_str(), 0755), 0);
    std::ofstream(base_ + "/secret") << "root only";
    ASSERT_EQ(::chmod((base_ + "/secret").c_str(), 0600), 0);
    ASSERT_EQ(::mkdir((base_ + "/mine").c_str(), 0755), 0);
    ASSERT_EQ(::chown((base_ + "/mine").c_str(), kNobody, kNoGroup), 0);
    ASSERT_EQ(::link((base_ + "/secret").c_str(), (base_ + "/mine/generation_config.json").c_str()),
              0);
    std::ofstream(base_ + "/mine/config.json") << "{}";
    SetAllowedRoots({base_});
  }
  void TearDown() override {
    SetJobFileIdentity(std::nullopt);
    SetAllowedRoots({});
    if (!base_.empty()) {
      ASSERT_EQ(std::system(("rm -rf '" + base_ + "'").c_str()), 0);
    }
  }
  std::string base_;
};

TEST_F(FileIdentityTest, AHardLinkToAFileTheUserCannotReadIsRefused) {
  ASSERT_TRUE(ReadFileConfined(base_ + "/mine/generation_config.json").ok());  // root's own rights
  SetJobFileIdentity(IdentityOfUid(kNobody));
  auto r = ReadFileConfined(base_ + "/mine/generation_config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  EXPECT_NE(r.status().message().find(base_ + "/mine/generation_config.json"), std::string::npos);
  EXPECT_TRUE(ReadFileConfined(base_ + "/mine/config.json").ok());  // what the user may read
  EXPECT_EQ(FsUid(), 0u) << "the thread's rights were not restored";
  // The daemon validating another client's job on this thread: its own rights there.
  {
    ScopedJobFileIdentity as_root(std::nullopt);
    EXPECT_TRUE(ReadFileConfined(base_ + "/secret").ok());
  }
  EXPECT_FALSE(ReadFileConfined(base_ + "/secret").ok());
}

TEST_F(FileIdentityTest, WhatTheJobWritesBelongsToItsUserAndNothingElseIsWritable) {
  ScopedJobFileIdentity as_nobody(IdentityOfUid(kNobody));
  ASSERT_TRUE(WriteFileAtomically(base_ + "/mine/out/x.json", "{}").code() ==
              StatusCode::kNotFound);
  ASSERT_TRUE(MakeDirsConfined(base_ + "/mine/out").ok());
  Status st = WriteFileAtomically(base_ + "/mine/out/x.json", "{}");
  ASSERT_TRUE(st.ok()) << st.ToString();
  struct stat sb {};
  ASSERT_EQ(::stat((base_ + "/mine/out/x.json").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, kNobody);
  ASSERT_EQ(::stat((base_ + "/mine/out").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, kNobody);
  // root's directory is not the user's to write in.
  st = WriteFileAtomically(base_ + "/x.json", "{}");
  EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << st.ToString();
  EXPECT_EQ(MakeDirsConfined(base_ + "/out").status().code(), StatusCode::kPermissionDenied);
}

TEST_F(FileIdentityTest, TheSwitchIsPerThread) {
  SetJobFileIdentity(IdentityOfUid(kNobody));
  std::promise<void> switched, done;
  std::thread other([&] {
    AsJobUser as_user;
    EXPECT_TRUE(as_user.status().ok()) << as_user.status().ToString();
    EXPECT_EQ(FsUid(), kNobody);
    switched.set_value();
    done.get_future().wait();
  });
  switched.get_future().wait();
  EXPECT_EQ(FsUid(), 0u);  // this thread keeps root's rights while the other holds nobody's
  {
    ScopedJobFileIdentity own(std::nullopt);
    EXPECT_TRUE(ReadFileConfined(base_ + "/secret").ok());
  }
  done.set_value();
  other.join();
}

TEST(FileIdentityOfUserTest, NamesAndGroups) {
  const FileIdentity root = IdentityOfUid(0);
  EXPECT_EQ(root.user, "root");
  EXPECT_EQ(root.gid, 0u);
  EXPECT_EQ(root.Describe(), "user root (uid 0)");
  const FileIdentity unknown = IdentityOfUid(4242424);
  EXPECT_EQ(unknown.gid, kNoGroup);
  EXPECT_TRUE(unknown.groups.empty());
  EXPECT_EQ(unknown.Describe(), "uid 4242424");
  EXPECT_EQ(IdentityOfUser("no-such-user-offloadd").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace offloadd
