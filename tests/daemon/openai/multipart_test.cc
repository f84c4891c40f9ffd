#include "daemon/openai/multipart.h"

#include <gtest/gtest.h>

namespace offloadd::daemon::openai {
namespace {

// The body the openai package (through httpx) sends for client.files.create.
const std::string kBody =
    "--b0undary\r\n"
    "Content-Disposition: form-data; name=\"purpose\"\r\n\r\n"
    "fine-tune\r\n"
    "--b0undary\r\n"
    "Content-Disposition: form-data; name=\"file\"; filename=\"train.jsonl\"\r\n"
    "Content-Type: application/octet-stream\r\n\r\n"
    "{\"messages\": []}\n\r\n{\"x\": 1}\r\n"
    "--b0undary--\r\n";

TEST(MultipartTest, ParsesTheOpenAiClientsUpload) {
  auto boundary = MultipartBoundary("multipart/form-data; boundary=b0undary");
  ASSERT_TRUE(boundary.ok()) << boundary.status().ToString();
  EXPECT_EQ(*boundary, "b0undary");
  auto parts = ParseMultipart(kBody, *boundary);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "purpose");
  EXPECT_EQ((*parts)[0].body, "fine-tune");
  EXPECT_EQ((*parts)[1].name, "file");
  EXPECT_EQ((*parts)[1].filename, "train.jsonl");
  EXPECT_EQ((*parts)[1].content_type, "application/octet-stream");
  // A CRLF inside the content is content; only CRLF + the delimiter ends it.
  EXPECT_EQ((*parts)[1].body, "{\"messages\": []}\n\r\n{\"x\": 1}");
}

TEST(MultipartTest, QuotedBoundaryAndCaseInsensitiveType) {
  auto boundary = MultipartBoundary("Multipart/Form-Data; charset=utf-8; boundary=\"a b\"");
  ASSERT_TRUE(boundary.ok()) << boundary.status().ToString();
  EXPECT_EQ(*boundary, "a b");
}

TEST(MultipartTest, MalformedBodiesAreRefusedSayingWhat) {
  EXPECT_NE(MultipartBoundary("application/json").status().message().find("multipart/form-data"),
            std::string::npos);
  EXPECT_NE(MultipartBoundary("multipart/form-data").status().message().find("boundary"),
            std::string::npos);
  const struct {
    std::string body, says;
  } cases[] = {
      {"no delimiter at all", "no boundary line"},
      {"--b\r\nContent-Disposition: form-data; name=\"f\"\r\n\r\nunterminated",
       "not closed by the boundary"},
      {"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--", "without a name"},
      {"--b\r\nContent-Disposition: attachment; name=\"f\"\r\n\r\nx\r\n--b--", "not form-data"},
      {"--b\r\nno colon here\r\n\r\nx\r\n--b--", "without ':'"},
      {"--b\r\nContent-Disposition: form-data; name=\"f\"", "without a header end"},
      {"--bX", "not followed by CRLF"},
  };
  for (const auto& c : cases) {
    auto parts = ParseMultipart(c.body, "b");
    ASSERT_FALSE(parts.ok()) << c.body;
    EXPECT_EQ(parts.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parts.status().message().find(c.says), std::string::npos) << parts.status().message();
  }
}

}  // namespace
}  // namespace offloadd::daemon::openai
