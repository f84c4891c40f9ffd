#pragma once
// Internal to the Jinja subset: the lexer (jinja_lexer.cc) that turns a template's source into
// the tokens the parser (jinja_parser.cc) reads. Errors are INVALID_ARGUMENT with the line.

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace offloadd::text::jinja {

struct Token {
  enum class Kind {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Kind kind;
  std::string text;
  int line;
};

// The tokens of `source`: text runs, tag delimiters (whitespace control applied), names,
// literals and operators, ending with kEof.
StatusOr<std::vector<Token>> Lex(std::string_view source);

}  // namespace offloadd::text::jinja
