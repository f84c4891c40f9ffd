// Lexer for the Jinja subset (see jinja.h): text, {{ }}, {% %} and {# #} with jinja2's whitespace
// control, names, string/number literals and operators, as jinja2/lexer.py splits them.

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include "text/jinja.h"
#include "text/jinja_lexer.h"

namespace offloadd::text::jinja {

namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool strip_next = false;  // a '-' closed the previous tag
    while (pos <= src_.size()) {
      size_t idx = src_.find('{', pos);
      while (idx != std::string_view::npos && idx + 1 < src_.size() && src_[idx + 1] != '{' &&
             src_[idx + 1] != '%' && src_[idx + 1] != '#') {
        idx = src_.find('{', idx + 1);
      }
      if (idx != std::string_view::npos && idx + 1 >= src_.size()) idx = std::string_view::npos;
      const size_t text_end = idx == std::string_view::npos ? src_.size() : idx;
      std::string text(src_.substr(pos, text_end - pos));
      if (strip_next) {
        size_t k = 0;
        while (k < text.size() && IsSpace(text[k])) ++k;
        text.erase(0, k);
      }
      if (idx != std::string_view::npos) {
        const char kind = src_[idx + 1];
        const char modifier = idx + 2 < src_.size() ? src_[idx + 2] : '\0';
        if (modifier == '-') {
          while (!text.empty() && IsSpace(text.back())) text.pop_back();
        } else if ((kind == '%' || kind == '#') && modifier != '+') {
          // lstrip_blocks: drop spaces/tabs between the start of the line and the tag.
          size_t k = text.size();
          while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
          const bool line_start = k > 0 ? text[k - 1] == '\n' : (pos == 0 || at_line_start_);
          if (line_start) text.erase(k);
        }
      }
      if (!text.empty()) Emit(Token::Kind::kText, text);
      CountLines(pos, text_end);
      if (idx == std::string_view::npos) break;
      const char kind = src_[idx + 1];
      pos = idx + 2;
      at_line_start_ = false;  // TrimBlock sets it again when it eats the newline after the tag
      if (pos < src_.size() && (src_[pos] == '-' || src_[pos] == '+')) ++pos;
      bool strip_after = false;
      if (kind == '#') {
        const size_t end = src_.find("#}", pos);
        if (end == std::string_view::npos) return Error("unterminated comment");
        strip_after = end > pos && src_[end - 1] == '-';
        CountLines(pos, end + 2);
        pos = end + 2;
        pos = TrimBlock(pos, strip_after);
      } else {
        Emit(kind == '{' ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "");
        ASSIGN_OR_RETURN(pos, LexInside(pos, kind == '{' ? '}' : '%', &strip_after));
        Emit(kind == '{' ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "");
        if (kind == '%') pos = TrimBlock(pos, strip_after);
      }
      strip_next = strip_after;
    }
    Emit(Token::Kind::kEof, "");
    return std::move(tokens_);
  }

 private:
  void Emit(Token::Kind k, std::string text) { tokens_.push_back({k, std::move(text), line_}); }
  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }
  Status Error(const std::string& msg) const {
    return InvalidArgumentError("line " + std::to_string(line_) + ": " + msg);
  }

  // trim_blocks: drop one newline right after a block or comment tag.
  size_t TrimBlock(size_t pos, bool strip_after) {
    if (strip_after) return pos;
    if (pos < src_.size() && src_[pos] == '\n') {
      ++line_;
      at_line_start_ = true;
      return pos + 1;
    }
    if (pos + 1 < src_.size() && src_[pos] == '\r' && src_[pos + 1] == '\n') {
      ++line_;
      at_line_start_ = true;
      return pos + 2;
    }
    return pos;
  }

  StatusOr<size_t> LexInside(size_t pos, char closer, bool* strip_after) {
    while (true) {
      while (pos < src_.size() && IsSpace(src_[pos])) {
        line_ += src_[pos] == '\n';
        ++pos;
      }
      if (pos >= src_.size()) return Error("unterminated tag");
      if (src_[pos] == '-' && pos + 2 < src_.size() + 1 &&
          src_.substr(pos + 1, 2) == std::string{closer, '}'}) {
        *strip_after = true;
        return pos + 3;
      }
      if (src_.substr(pos, 2) == std::string{closer, '}'} && !(closer == '}' && depth_ > 0)) {
        return pos + 2;
      }
      const char c = src_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        Emit(Token::Kind::kName, std::string(src_.substr(pos, e - pos)));
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        bool is_float = false;
        while (e < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        if (e + 1 < src_.size() && src_[e] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t k = e + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
            is_float = true;
            e = k;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string num(src_.substr(pos, e - pos));
        std::erase(num, '_');
        Emit(is_float ? Token::Kind::kFloat : Token::Kind::kInt, num);
        pos = e;
      } else if (c == '\'' || c == '"') {
        std::string s;
        size_t e = pos + 1;
        for (; e < src_.size() && src_[e] != c; ++e) {
          if (src_[e] == '\\' && e + 1 < src_.size()) {
            ++e;
            switch (src_[e]) {
              case 'n':
                s += '\n';
                break;
              case 't':
                s += '\t';
                break;
              case 'r':
                s += '\r';
                break;
              case '\\':
                s += '\\';
                break;
              case '\'':
                s += '\'';
                break;
              case '"':
                s += '"';
                break;
              case '\n':
                break;
              default:
                s += '\\';
                s += src_[e];
                break;
            }
          } else {
            line_ += src_[e] == '\n';
            s += src_[e];
          }
        }
        if (e >= src_.size()) return Error("unterminated string literal");
        Emit(Token::Kind::kString, std::move(s));
        pos = e + 1;
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ".",  ",",  ":",  "|"};
        bool matched = false;
        for (const char* op : kOps) {
          const std::string_view o(op);
          if (src_.substr(pos, o.size()) == o) {
            if (o == "{" || o == "[" || o == "(") ++depth_;
            if ((o == "}" || o == "]" || o == ")") && depth_ > 0) --depth_;
            Emit(Token::Kind::kOp, std::string(o));
            pos += o.size();
            matched = true;
            break;
          }
        }
        if (!matched) return Error(std::string("unexpected character '") + c + "'");
      }
    }
  }

  std::string_view src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  int depth_ = 0;  // bracket nesting inside a tag, so "}}" closing a dict is not the tag end
  bool at_line_start_ = false;
};

}  // namespace

StatusOr<std::vector<Token>> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace offloadd::text::jinja
