#pragma once
// Internal to the Jinja subset (jinja_eval.cc): Python string/dict methods, `is` tests, globals
// and the string helpers the filters share. Errors are INVALID_ARGUMENT without a line number;
// the evaluator adds it.

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/jinja_value.h"

namespace offloadd::text::jinja {

// str.strip/lstrip/rstrip: `chars` (a string value) or Python whitespace when null.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right);
// str.upper()/lower() with full Unicode case mapping.
std::string AsciiCase(std::string s, bool upper);
// str.title() for ASCII letters.
std::string Title(const std::string& s);
// str.split(sep, maxsplit): whitespace runs when `sep` is null/none; maxsplit < 0: no limit.
std::vector<std::string> PySplit(const std::string& s, const Value* sep, int64_t maxsplit);
// str.replace(from, to, count); count < 0: all.
std::string ReplaceStr(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);
// The keyword argument `name`, else the positional one at `pos`, else null.
const Value* Arg(const std::vector<Value>& args, const KwArgs& kwargs, size_t pos,
                 const char* name);

// A bound method of a dict (items, keys, values, get) or a string (strip, split, startswith,
// replace, ...), or nullopt when there is none of that name.
std::optional<Value> DictMethod(const Value& obj, const std::string& name);
std::optional<Value> StringMethod(const std::string& s, const std::string& name);

// The tojson filter: indent=, sort_keys=, separators= as jinja2 passes them to json.dumps.
StatusOr<std::string> ToJsonFilter(const Value& in, const std::vector<Value>& args,
                                   const KwArgs& kwargs);
// The escape filter: & < > " ' as jinja2's markupsafe writes them.
std::string HtmlEscape(const std::string& s);

// `v is name(args)`.
StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const std::vector<Value>& args);

// x op y for + - * / // % ** on numbers (bools already converted): Python semantics, with
// integer overflow an error.
StatusOr<Value> Arithmetic(const std::string& op, const Value& x, const Value& y);
// int(d) for a float; overflow (including NaN and infinities) is an error.
StatusOr<int64_t> FloatToInt(double d);

// raise_exception, namespace, dict, range, strftime_now.
// `namespaces`, when given, receives every namespace() the template creates (the caller clears
// them after the rendering: namespaces are the only mutable values, so every cycle runs through one).
void InstallGlobals(std::unordered_map<std::string, Value>* globals,
                    std::vector<Value>* namespaces = nullptr);

}  // namespace offloadd::text::jinja
