#include "common/message_text.h"

#include <gtest/gtest.h>

#include <string>

namespace offloadd {
namespace {

TEST(SafeMessageTextTest, ValidTextPassesUnchanged) {
  const std::string s = "line 1\n\tcaf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
  EXPECT_EQ(SafeMessageText(s), s);
}

TEST(SafeMessageTextTest, InvalidUtf8AndControlBytesAreEscaped) {
  EXPECT_EQ(SafeMessageText("a\xff" "b"), "a\\xffb");
  EXPECT_EQ(SafeMessageText("\xc3"), "\\xc3");               // truncated sequence
  EXPECT_EQ(SafeMessageText("\xc0\xaf"), "\\xc0\\xaf");      // overlong '/'
  EXPECT_EQ(SafeMessageText("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // surrogate
  EXPECT_EQ(SafeMessageText("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // > U+10FFFF
  EXPECT_EQ(SafeMessageText(std::string("nul\0bell\a", 9)), "nul\\x00bell\\x07");
}

TEST(SafeMessageTextTest, LongTextIsCutAtACharacterBoundaryAndSaysSo) {
  std::string s;
  for (int i = 0; i < 1000; ++i) s += "\xc3\xa9";  // 2000 bytes
  const std::string out = SafeMessageText(s, 101);
  EXPECT_EQ(out.substr(0, 100), s.substr(0, 100));
  EXPECT_EQ(out.substr(100), "... [2000 bytes in all]");
  EXPECT_EQ(SafeMessageText(std::string(1 << 20, 'x')).size(), 2048 + std::string("... [1048576 bytes in all]").size());
}

}  // namespace
}  // namespace offloadd
