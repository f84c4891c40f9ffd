#pragma once
// Internal: the syntax tree shared by jinja_parser.cc and jinja_eval.cc.

#include <memory>
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace offloadd::text::jinja {

struct Node {
  enum class Type {
    // expressions
    kLiteral,
    kName,
    kGetAttr,
    kGetItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kAnd,
    kOr,
    kNot,
    kCondExpr,
    kListLit,
    kTupleLit,
    kDictLit,
    // statements
    kBody,
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue,
    kGeneration,
  };
  Type type;
  int line = 0;
  std::string name;  // variable / attribute / filter / test / operator / set target name
  Value literal;     // kLiteral, kText (string)
  std::vector<std::shared_ptr<Node>> children;  // operands, list items, body statements
  std::vector<std::string> kwarg_names;         // kCall/kFilter/kTest: names of trailing args
  bool negated = false;                         // kTest: "is not"
  // kIf: children = [cond0, body0, cond1, body1, ..., (else body)], has_else.
  // kFor: targets in `targets`, children = [iterable, body, else body, filter cond or null].
  // kSet: targets (one name, a tuple of names, or "ns.attr"), children = [value].
  // kMacro: name, targets = parameter names, children = [body, default0, default1, ...].
  // kGeneration: children = [body].
  std::vector<std::string> targets;
  bool has_else = false;

  Node(Type t, int l) : type(t), line(l) {}
};

using NodePtr = std::shared_ptr<Node>;

}  // namespace offloadd::text::jinja
