// Recursive-descent parser for the Jinja subset (see jinja.h; tokens from jinja_lexer.cc). The
// grammar and the operator precedence follow jinja2/parser.py so templates parse as in Python.

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

#include "text/jinja.h"
#include "text/jinja_ast.h"
#include "text/jinja_lexer.h"

namespace offloadd::text::jinja {

namespace {

// The filters and tests the evaluator implements (ApplyFilter in jinja_eval.cc, ApplyTest in
// jinja_builtins.cc). A template naming another one is refused when it is parsed, with the line,
// so that a job is refused at validation, not when a rarely taken branch first renders.
bool KnownFilter(const std::string& name) {
  static const std::set<std::string> kFilters = {
      "abs",     "capitalize", "count",  "d",          "default", "e",       "escape",
      "first",   "float",      "indent", "int",        "items",   "join",    "last",
      "length",  "list",       "lower",  "map",        "reject",  "rejectattr", "replace",
      "reverse", "round",      "safe",   "select",     "selectattr", "sort", "string",
      "title",   "tojson",     "trim",   "unique",     "upper"};
  return kFilters.count(name) != 0;
}

bool KnownTest(const std::string& name) {
  static const std::set<std::string> kTests = {
      "defined", "undefined", "none",  "string", "number",   "integer",     "float",
      "boolean", "true",      "false", "mapping", "sequence", "iterable",   "callable",
      "odd",     "even",      "divisibleby", "equalto", "eq", "==",         "sameas",
      "ne",      "!=",        "lt",    "gt",     "le",       "ge",          "in"};
  return kTests.count(name) != 0;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  StatusOr<NodePtr> ParseTemplate() {
    std::string end;
    ASSIGN_OR_RETURN(NodePtr body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& Next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool IsOp(const char* op, size_t k = 0) const {
    return Peek(k).kind == Token::Kind::kOp && Peek(k).text == op;
  }
  bool IsName(const char* name, size_t k = 0) const {
    return Peek(k).kind == Token::Kind::kName && Peek(k).text == name;
  }
  Status Error(const std::string& msg) const {
    return InvalidArgumentError("line " + std::to_string(Peek().line) + ": " + msg);
  }
  Status Expect(const char* op) {
    if (!IsOp(op)) return Error(std::string("expected '") + op + "', got '" + Peek().text + "'");
    ++i_;
    return OkStatus();
  }
  Status ExpectBlockEnd() {
    if (Peek().kind != Token::Kind::kBlockEnd) {
      return Error("expected end of statement '%}', got '" + Peek().text + "'");
    }
    ++i_;
    return OkStatus();
  }
  StatusOr<std::string> ExpectName() {
    if (Peek().kind != Token::Kind::kName)
      return Error("expected a name, got '" + Peek().text + "'");
    return Next().text;
  }
  NodePtr Make(Node::Type type) { return std::make_shared<Node>(type, Peek().line); }

  // Parses statements until a block tag whose keyword is in `ends` (left as *end, consumed up
  // to and including the keyword) or the end of input (only allowed when `ends` is empty).
  // Nesting guard: a pathological template must fail cleanly, not overflow the stack.
  struct DepthGuard {
    explicit DepthGuard(int* d) : depth(d) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };
  static constexpr int kMaxDepth = 256;

  StatusOr<NodePtr> ParseBody(const std::set<std::string>& ends, std::string* end) {
    DepthGuard guard(&nesting_);
    if (nesting_ > kMaxDepth) return Error("template nested too deeply");
    NodePtr body = Make(Node::Type::kBody);
    while (true) {
      const Token& tok = Peek();
      if (tok.kind == Token::Kind::kEof) {
        if (!ends.empty()) {
          return Error("unexpected end of template, expected one of: " + Join(ends));
        }
        return body;
      }
      if (tok.kind == Token::Kind::kText) {
        NodePtr text = Make(Node::Type::kText);
        text->literal = Value::String(Next().text);
        body->children.push_back(text);
      } else if (tok.kind == Token::Kind::kVarBegin) {
        ++i_;
        NodePtr out = Make(Node::Type::kOutput);
        ASSIGN_OR_RETURN(NodePtr e, ParseTuple());
        out->children.push_back(e);
        if (Peek().kind != Token::Kind::kVarEnd)
          return Error("expected '}}', got '" + Peek().text + "'");
        ++i_;
        body->children.push_back(out);
      } else if (tok.kind == Token::Kind::kBlockBegin) {
        ++i_;
        ASSIGN_OR_RETURN(std::string kw, ExpectName());
        if (ends.count(kw)) {
          *end = kw;
          return body;
        }
        ASSIGN_OR_RETURN(NodePtr stmt, ParseStatement(kw));
        if (stmt) body->children.push_back(stmt);
      } else {
        return Error("unexpected '" + tok.text + "'");
      }
    }
  }

  static std::string Join(const std::set<std::string>& s) {
    std::string out;
    for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
    return out;
  }

  StatusOr<NodePtr> ParseStatement(const std::string& kw) {
    if (kw == "if") return ParseIf();
    if (kw == "for") return ParseFor();
    if (kw == "set") return ParseSet();
    if (kw == "macro") return ParseMacro();
    if (kw == "break" || kw == "continue") {
      NodePtr n = Make(kw == "break" ? Node::Type::kBreak : Node::Type::kContinue);
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
    if (kw == "generation") {
      // transformers' AssistantTracker: marks assistant spans; the text renders unchanged.
      NodePtr n = Make(Node::Type::kGeneration);
      RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      ASSIGN_OR_RETURN(NodePtr body, ParseBody({"endgeneration"}, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      n->children = {body};
      has_generation_ = true;
      return n;
    }
    return Error("unsupported statement '{% " + kw + " %}'");
  }

  StatusOr<NodePtr> ParseIf() {
    NodePtr n = Make(Node::Type::kIf);
    while (true) {
      ASSIGN_OR_RETURN(NodePtr cond, ParseTuple());
      RETURN_IF_ERROR(ExpectBlockEnd());
      std::string end;
      ASSIGN_OR_RETURN(NodePtr body, ParseBody({"elif", "else", "endif"}, &end));
      n->children.push_back(cond);
      n->children.push_back(body);
      if (end == "elif") continue;
      if (end == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(NodePtr else_body, ParseBody({"endif"}, &end));
        n->children.push_back(else_body);
        n->has_else = true;
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      return n;
    }
  }

  StatusOr<NodePtr> ParseFor() {
    NodePtr n = Make(Node::Type::kFor);
    do {
      ASSIGN_OR_RETURN(std::string t, ExpectName());
      n->targets.push_back(t);
    } while (IsOp(",") && (++i_, true));
    if (!IsName("in")) return Error("expected 'in' in for loop");
    ++i_;
    ASSIGN_OR_RETURN(NodePtr iter, ParseTuple(/*with_condexpr=*/false));
    NodePtr filter;
    if (IsName("if")) {
      ++i_;
      ASSIGN_OR_RETURN(filter, ParseExpression());
    }
    if (IsName("recursive")) return Error("recursive for loops are not supported");
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ASSIGN_OR_RETURN(NodePtr body, ParseBody({"else", "endfor"}, &end));
    NodePtr else_body;
    if (end == "else") {
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(else_body, ParseBody({"endfor"}, &end));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    n->children = {iter, body, else_body, filter};
    return n;
  }

  StatusOr<NodePtr> ParseSet() {
    NodePtr n = Make(Node::Type::kSet);
    ASSIGN_OR_RETURN(std::string first, ExpectName());
    if (IsOp(".")) {
      ++i_;
      ASSIGN_OR_RETURN(std::string attr, ExpectName());
      n->targets = {first + "." + attr};
    } else {
      n->targets = {first};
      while (IsOp(",")) {
        ++i_;
        ASSIGN_OR_RETURN(std::string t, ExpectName());
        n->targets.push_back(t);
      }
    }
    if (Peek().kind == Token::Kind::kBlockEnd && n->targets.size() == 1 &&
        n->targets[0].find('.') == std::string::npos) {
      ++i_;
      n->type = Node::Type::kSetBlock;
      std::string end;
      ASSIGN_OR_RETURN(NodePtr body, ParseBody({"endset"}, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      n->children = {body};
      return n;
    }
    RETURN_IF_ERROR(Expect("="));
    ASSIGN_OR_RETURN(NodePtr value, ParseTuple());
    RETURN_IF_ERROR(ExpectBlockEnd());
    n->children = {value};
    return n;
  }

  StatusOr<NodePtr> ParseMacro() {
    NodePtr n = Make(Node::Type::kMacro);
    ASSIGN_OR_RETURN(n->name, ExpectName());
    RETURN_IF_ERROR(Expect("("));
    std::vector<NodePtr> defaults;
    while (!IsOp(")")) {
      ASSIGN_OR_RETURN(std::string p, ExpectName());
      n->targets.push_back(p);
      NodePtr def;
      if (IsOp("=")) {
        ++i_;
        ASSIGN_OR_RETURN(def, ParseExpression());
      }
      defaults.push_back(def);
      if (!IsOp(",")) break;
      ++i_;
    }
    RETURN_IF_ERROR(Expect(")"));
    RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end;
    ASSIGN_OR_RETURN(NodePtr body, ParseBody({"endmacro"}, &end));
    RETURN_IF_ERROR(ExpectBlockEnd());
    n->children.push_back(body);
    for (auto& d : defaults) n->children.push_back(d);
    return n;
  }

  // ---- expressions ----

  // An expression, or a tuple of them separated by commas (without parentheses).
  StatusOr<NodePtr> ParseTuple(bool with_condexpr = true) {
    const int line = Peek().line;
    ASSIGN_OR_RETURN(NodePtr first, with_condexpr ? ParseExpression() : ParseOr());
    if (!IsOp(",")) return first;
    NodePtr tuple = std::make_shared<Node>(Node::Type::kTupleLit, line);
    tuple->children.push_back(first);
    while (IsOp(",")) {
      ++i_;
      if (Peek().kind == Token::Kind::kBlockEnd || Peek().kind == Token::Kind::kVarEnd) break;
      ASSIGN_OR_RETURN(NodePtr e, with_condexpr ? ParseExpression() : ParseOr());
      tuple->children.push_back(e);
    }
    return tuple;
  }

  StatusOr<NodePtr> ParseExpression() {
    DepthGuard guard(&nesting_);
    if (nesting_ > kMaxDepth) return Error("expression nested too deeply");
    ASSIGN_OR_RETURN(NodePtr expr, ParseOr());
    while (IsName("if")) {
      NodePtr n = Make(Node::Type::kCondExpr);
      ++i_;
      ASSIGN_OR_RETURN(NodePtr cond, ParseOr());
      NodePtr otherwise;
      if (IsName("else")) {
        ++i_;
        ASSIGN_OR_RETURN(otherwise, ParseExpression());
      }
      n->children = {cond, expr, otherwise};
      expr = n;
    }
    return expr;
  }

  StatusOr<NodePtr> ParseOr() {
    ASSIGN_OR_RETURN(NodePtr left, ParseAnd());
    while (IsName("or")) {
      NodePtr n = Make(Node::Type::kOr);
      ++i_;
      ASSIGN_OR_RETURN(NodePtr right, ParseAnd());
      n->children = {left, right};
      left = n;
    }
    return left;
  }

  StatusOr<NodePtr> ParseAnd() {
    ASSIGN_OR_RETURN(NodePtr left, ParseNot());
    while (IsName("and")) {
      NodePtr n = Make(Node::Type::kAnd);
      ++i_;
      ASSIGN_OR_RETURN(NodePtr right, ParseNot());
      n->children = {left, right};
      left = n;
    }
    return left;
  }

  StatusOr<NodePtr> ParseNot() {
    if (IsName("not")) {
      NodePtr n = Make(Node::Type::kNot);
      ++i_;
      ASSIGN_OR_RETURN(NodePtr operand, ParseNot());
      n->children = {operand};
      return n;
    }
    return ParseCompare();
  }

  StatusOr<NodePtr> ParseCompare() {
    ASSIGN_OR_RETURN(NodePtr left, ParseMath1());
    while (true) {
      std::string op;
      if (Peek().kind == Token::Kind::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        ++i_;
        op = "in";
      } else if (IsName("not") && IsName("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        return left;
      }
      NodePtr n = Make(Node::Type::kBinary);
      n->name = op;
      ASSIGN_OR_RETURN(NodePtr right, ParseMath1());
      n->children = {left, right};
      left = n;
    }
  }

  StatusOr<NodePtr> ParseBinaryLevel(const std::vector<std::string>& ops,
                                     StatusOr<NodePtr> (Parser::*next)()) {
    ASSIGN_OR_RETURN(NodePtr left, (this->*next)());
    while (Peek().kind == Token::Kind::kOp &&
           std::find(ops.begin(), ops.end(), Peek().text) != ops.end()) {
      NodePtr n = Make(Node::Type::kBinary);
      n->name = Next().text;
      ASSIGN_OR_RETURN(NodePtr right, (this->*next)());
      n->children = {left, right};
      left = n;
    }
    return left;
  }
  StatusOr<NodePtr> ParseMath1() { return ParseBinaryLevel({"+", "-"}, &Parser::ParseConcat); }
  StatusOr<NodePtr> ParseConcat() { return ParseBinaryLevel({"~"}, &Parser::ParseMath2); }
  StatusOr<NodePtr> ParseMath2() {
    return ParseBinaryLevel({"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  StatusOr<NodePtr> ParsePow() { return ParseBinaryLevel({"**"}, &Parser::ParseUnaryFiltered); }
  StatusOr<NodePtr> ParseUnaryFiltered() { return ParseUnary(true); }

  StatusOr<NodePtr> ParseUnary(bool with_filter) {
    NodePtr node;
    if (IsOp("-") || IsOp("+")) {
      NodePtr n = Make(Node::Type::kUnary);
      n->name = Next().text;
      ASSIGN_OR_RETURN(NodePtr operand, ParseUnary(false));
      n->children = {operand};
      node = n;
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
      ASSIGN_OR_RETURN(node, ParsePostfix(node));
    }
    if (with_filter) return ParseFilterExpr(node);
    return node;
  }

  // Number literals: std::stoll/stod would throw std::out_of_range on {{ 99999999999999999999 }}
  // (Python has big integers; chat templates never need them) or {{ 1e999 }}.
  StatusOr<int64_t> IntLiteral(const std::string& text) {
    int64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return Error("integer literal out of range (64-bit): " + text.substr(0, 40));
    }
    return v;
  }

  StatusOr<double> FloatLiteral(const std::string& text) {
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(text.c_str(), &end);
    // Underflow to zero or a subnormal is what Python does; overflow to infinity is refused.
    if (end != text.c_str() + text.size() || std::isinf(v)) {
      return Error("float literal out of range: " + text.substr(0, 40));
    }
    return v;
  }

  StatusOr<NodePtr> ParsePrimary() {
    const Token& tok = Peek();
    NodePtr n = Make(Node::Type::kLiteral);
    switch (tok.kind) {
      case Token::Kind::kName: {
        const std::string name = Next().text;
        if (name == "true" || name == "True")
          n->literal = Value::Bool(true);
        else if (name == "false" || name == "False")
          n->literal = Value::Bool(false);
        else if (name == "none" || name == "None")
          n->literal = Value::None();
        else {
          n->type = Node::Type::kName;
          n->name = name;
        }
        return n;
      }
      case Token::Kind::kString: {
        std::string s = Next().text;
        while (Peek().kind == Token::Kind::kString) s += Next().text;  // implicit concatenation
        n->literal = Value::String(std::move(s));
        return n;
      }
      case Token::Kind::kInt: {
        ASSIGN_OR_RETURN(int64_t i, IntLiteral(Next().text));
        n->literal = Value::Int(i);
        return n;
      }
      case Token::Kind::kFloat: {
        ASSIGN_OR_RETURN(double d, FloatLiteral(Next().text));
        n->literal = Value::Float(d);
        return n;
      }
      case Token::Kind::kOp:
        if (tok.text == "(") {
          ++i_;
          if (IsOp(")")) {
            ++i_;
            n->type = Node::Type::kTupleLit;
            return n;
          }
          ASSIGN_OR_RETURN(NodePtr inner, ParseTuple());
          RETURN_IF_ERROR(Expect(")"));
          return inner;
        }
        if (tok.text == "[") {
          ++i_;
          n->type = Node::Type::kListLit;
          while (!IsOp("]")) {
            ASSIGN_OR_RETURN(NodePtr e, ParseExpression());
            n->children.push_back(e);
            if (!IsOp(",")) break;
            ++i_;
          }
          RETURN_IF_ERROR(Expect("]"));
          return n;
        }
        if (tok.text == "{") {
          ++i_;
          n->type = Node::Type::kDictLit;
          while (!IsOp("}")) {
            ASSIGN_OR_RETURN(NodePtr k, ParseExpression());
            RETURN_IF_ERROR(Expect(":"));
            ASSIGN_OR_RETURN(NodePtr v, ParseExpression());
            n->children.push_back(k);
            n->children.push_back(v);
            if (!IsOp(",")) break;
            ++i_;
          }
          RETURN_IF_ERROR(Expect("}"));
          return n;
        }
        break;
      default:
        break;
    }
    return Error("unexpected '" + tok.text + "' in expression");
  }

  Status ParseArgs(NodePtr call) {
    RETURN_IF_ERROR(Expect("("));
    while (!IsOp(")")) {
      if (Peek().kind == Token::Kind::kName && IsOp("=", 1)) {
        call->kwarg_names.push_back(Next().text);
        ++i_;
      } else if (!call->kwarg_names.empty()) {
        return Error("positional argument after keyword argument");
      }
      ASSIGN_OR_RETURN(NodePtr arg, ParseExpression());
      call->children.push_back(arg);
      if (!IsOp(",")) break;
      ++i_;
    }
    return Expect(")");
  }

  StatusOr<NodePtr> ParsePostfix(NodePtr node) {
    while (true) {
      if (IsOp(".")) {
        ++i_;
        NodePtr n = Make(Node::Type::kGetAttr);
        if (Peek().kind == Token::Kind::kInt) {
          n->type = Node::Type::kGetItem;
          NodePtr idx = Make(Node::Type::kLiteral);
          ASSIGN_OR_RETURN(int64_t i, IntLiteral(Next().text));
          idx->literal = Value::Int(i);
          n->children = {node, idx};
        } else {
          ASSIGN_OR_RETURN(n->name, ExpectName());
          n->children = {node};
        }
        node = n;
      } else if (IsOp("[")) {
        ++i_;
        NodePtr n = Make(Node::Type::kGetItem);
        NodePtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[k], ParseExpression());
          }
          if (IsOp(":") && k < 2) {
            is_slice = true;
            ++i_;
          } else {
            break;
          }
        }
        RETURN_IF_ERROR(Expect("]"));
        if (is_slice) {
          n->type = Node::Type::kSlice;
          n->children = {node, parts[0], parts[1], parts[2]};
        } else {
          if (!parts[0]) return Error("empty subscript");
          n->children = {node, parts[0]};
        }
        node = n;
      } else if (IsOp("(")) {
        NodePtr n = Make(Node::Type::kCall);
        n->children.push_back(node);
        RETURN_IF_ERROR(ParseArgs(n));
        node = n;
      } else {
        return node;
      }
    }
  }

  StatusOr<NodePtr> ParseFilterExpr(NodePtr node) {
    while (true) {
      if (IsOp("|")) {
        ++i_;
        NodePtr n = Make(Node::Type::kFilter);
        ASSIGN_OR_RETURN(n->name, ExpectName());
        if (!KnownFilter(n->name)) return Error("unsupported filter '" + n->name + "'");
        n->children.push_back(node);
        if (IsOp("(")) RETURN_IF_ERROR(ParseArgs(n));
        node = n;
      } else if (IsName("is")) {
        ++i_;
        NodePtr n = Make(Node::Type::kTest);
        if (IsName("not")) {
          ++i_;
          n->negated = true;
        }
        ASSIGN_OR_RETURN(n->name, ExpectName());
        if (!KnownTest(n->name)) return Error("unsupported test '" + n->name + "'");
        n->children.push_back(node);
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseArgs(n));
        } else if (Peek().kind == Token::Kind::kString || Peek().kind == Token::Kind::kInt ||
                   Peek().kind == Token::Kind::kFloat ||
                   (Peek().kind == Token::Kind::kName && !IsName("and") && !IsName("or") &&
                    !IsName("else") && !IsName("if") && !IsName("in") && !IsName("not"))) {
          ASSIGN_OR_RETURN(NodePtr arg, ParsePrimary());  // `is equalto 'x'`, `is divisibleby 3`
          n->children.push_back(arg);
        }
        node = n;
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int nesting_ = 0;

 public:
  bool has_generation_ = false;
};

}  // namespace

StatusOr<Template> Template::Parse(std::string_view source) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source));
  Parser parser(std::move(tokens));
  ASSIGN_OR_RETURN(NodePtr root, parser.ParseTemplate());
  Template t;
  t.root_ = root;
  t.has_generation_blocks_ = parser.has_generation_;
  return t;
}

}  // namespace offloadd::text::jinja
