#include "daemon/server/token_auth.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace offloadd::daemon {
namespace {

const std::string kA = "aaaaaaaaaaaaaaaa-token";
const std::string kB = "bbbbbbbbbbbbbbbb-token";

TEST(TokenFileTest, ABareTokenIsOneOperatorWithoutAName) {
  auto t = ParseTokenFile("  " + kA + "  \r\n", "f");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 1u);
  EXPECT_EQ((*t)[0].name, "");
  EXPECT_EQ((*t)[0].token, kA);
  EXPECT_TRUE((*t)[0].is_operator);
}

TEST(TokenFileTest, NamedClientsWithCommentsBlankLinesAndRoles) {
  auto t = ParseTokenFile("# who may use TCP\n\nalice " + kA + "\n  ops@ci " + kB + " operator\n", "f");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].name, "alice");
  EXPECT_EQ((*t)[0].token, kA);
  EXPECT_FALSE((*t)[0].is_operator);
  EXPECT_EQ((*t)[1].name, "ops@ci");
  EXPECT_TRUE((*t)[1].is_operator);
}

TEST(TokenFileTest, AHashInsideATokenIsPartOfIt) {
  auto t = ParseTokenFile("alice abc#defghijklmnopq\n", "f");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)[0].token, "abc#defghijklmnopq");
}

TEST(TokenFileTest, EveryBadLineIsNamedWithItsNumber) {
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {"", "must hold a token of at least 16"},
      {"# only a comment\n", "must hold a token of at least 16"},
      {"short\n", "f:1: a token must have at least 16"},
      {"alice " + kA + "\nbob short\n", "f:2: a token must have at least 16"},
      {"alice " + kA + "\nalice " + kB + "\n", "f:2: client 'alice' is named twice"},
      {"alice " + kA + "\nbob " + kA + "\n", "f:2: this token is already given to another client"},
      {"alice " + kA + " admin\n", "f:1: the third word must be the role 'operator'"},
      {"alice operator " + kA + "\n", "f:1: the third word must be the role 'operator'"},
      {"al/ice " + kA + "\n", "f:1: client name must be 1..64"},
      {std::string(65, 'n') + " " + kA + "\n", "f:1: client name must be 1..64"},
      {"alice " + kA + " operator extra\n",
       "f:1: expected '<name> <token> [operator] [user=<local user>]'"},
      {kA + "\nbob " + kB + "\n", "a bare token cannot stand beside other lines"},
      {kA + "\n" + kB + "\n", "a bare token cannot stand beside other lines"},
  };
  for (const auto& c : cases) {
    auto t = ParseTokenFile(c.text, "f");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(t.status().message().find(c.error), std::string::npos) << c.text << " -> " << t.status().ToString();
    // A token never appears in an error.
    EXPECT_EQ(t.status().message().find("-token"), std::string::npos) << t.status().ToString();
  }
}

// A token travels in an HTTP/2 header, so a byte order mark, a NUL, a control
// character or a non-ASCII byte in a token line made a file that passed --validate-config and that
// no client could authenticate with. Each is refused naming file:line, and the token is never
// echoed.
TEST(TokenFileTest, BytesNoHeaderCanCarryAreRefusedNamingTheLine) {
  const struct {
    std::string text;
    std::string error;
  } cases[] = {
      {"\xEF\xBB\xBF" + kA + "\n", "f:1: starts with a UTF-8 byte order mark"},
      {"\xEF\xBB\xBF"
       "alice " +
           kA + "\n",
       "f:1: starts with a UTF-8 byte order mark"},
      {"alice " + kA + std::string(1, '\0') + "\n", "f:1: column 29: a NUL byte"},
      {"# ok\nalice " + kA + "\nbob " + kB + "\xC3\xA9\n", "f:3: column 27: a non-ASCII byte"},
      {"alice " + kA + "\nbob\xC2\xA0" + kB + "\n", "f:2: column 4: a non-ASCII byte"},
      {"alice " + kA + "\x7f\n", "f:1: column 29: a control character"},
      {"alice " + kA + "\x1b[0m\n", "f:1: column 29: a control character"},
      {"alice\r" + kA + "\n", "f:1: column 6: a control character"},
      {std::string("# a NUL in a comment\0\nalice ", 28) + kA + "\n", "f:1: column 21: a NUL byte"},
  };
  for (const auto& c : cases) {
    auto t = ParseTokenFile(c.text, "f");
    ASSERT_FALSE(t.ok()) << c.text;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument) << c.text;
    EXPECT_NE(t.status().message().find(c.error), std::string::npos)
        << c.text << " -> " << t.status().ToString();
    EXPECT_EQ(t.status().message().find("-token"), std::string::npos) << t.status().ToString();
  }
  // What stays accepted: CRLF line ends, tabs between words, UTF-8 in a comment.
  auto ok = ParseTokenFile("# Jürgen's\r\nalice\t" + kA + "\r\nbob " + kB + " operator\r\n", "f");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size(), 2u);
}

// A line may name the local user whose rights its client's jobs get.
TEST(TokenFileTest, AUserOnALineNamesWhoseRightsItsJobsGet) {
  auto t = ParseTokenFile("alice " + kA + " user=alice\nops " + kB + " operator user=root\n", "f");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ((*t)[0].user, "alice");
  EXPECT_FALSE((*t)[0].is_operator);
  EXPECT_EQ((*t)[1].user, "root");
  EXPECT_TRUE((*t)[1].is_operator);
  EXPECT_EQ((*t)[1].line, 2);
  for (const std::string& bad :
       {"alice " + kA + " user=\n", "alice " + kA + " user=a/b\n",
        "alice " + kA + " user=a user=b\n", "alice " + kA + " user=a operator\n"}) {
    auto r = ParseTokenFile(bad, "f");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("f:1: "), std::string::npos) << r.status().ToString();
    EXPECT_EQ(r.status().message().find("-token"), std::string::npos) << r.status().ToString();
  }
}

class TokenFileOnDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/token_auth_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string Write(const std::string& text, mode_t mode) {
    const std::string path = dir_ + "/token";
    std::ofstream(path, std::ios::trunc) << text;
    chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(TokenFileOnDiskTest, ModeAndTypeAreCheckedBeforeTheText) {
  auto open = ReadTokenFile(Write("alice " + kA + "\n", 0644));
  ASSERT_FALSE(open.ok());
  EXPECT_EQ(open.status().code(), StatusCode::kPermissionDenied);
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos);

  auto ok = ReadTokenFile(Write("alice " + kA + "\nbob " + kB + " operator\n", 0600));
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size(), 2u);

  // The file as --validate-config and the daemon read it: the same refusals.
  auto bom =
      ReadTokenFile(Write("\xEF\xBB\xBF"
                          "alice " +
                              kA + "\n",
                          0600));
  ASSERT_FALSE(bom.ok());
  EXPECT_NE(bom.status().message().find(dir_ + "/token:1: starts with a UTF-8 byte order mark"),
            std::string::npos)
      << bom.status().ToString();

  // A user= that names no local user is refused when the file is read (--validate-config).
  auto nouser =
      ReadTokenFile(Write("alice " + kA + "\nbob " + kB + " user=no-such-user-offloadd\n", 0600));
  ASSERT_FALSE(nouser.ok());
  EXPECT_NE(nouser.status().message().find(dir_ + "/token:2: user=no-such-user-offloadd"),
            std::string::npos)
      << nouser.status().ToString();

  auto dir = ReadTokenFile(dir_);
  ASSERT_FALSE(dir.ok());
  auto missing = ReadTokenFile(dir_ + "/none");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("/none"), std::string::npos);
}

}  // namespace
}  // namespace offloadd::daemon
