#pragma once
// A five-token byte-level BPE (a, b, the space marker, the merge ab, <|endoftext|>) for the tests
// of what encodes records (dataset_test.cc, gzip_reader_test.cc).
#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "text/tokenizer.h"

namespace offloadd::test_util {

inline std::unique_ptr<text::Tokenizer> ToyTokenizer() {
  auto t = text::Tokenizer::FromJson(R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "Ġ": 2, "ab": 3},
              "merges": ["a b"]},
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},
    "decoder": {"type": "ByteLevel"},
    "added_tokens": [{"id": 4, "content": "<|endoftext|>", "special": true, "normalized": false}]
  })");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(*t);
}

}  // namespace offloadd::test_util
