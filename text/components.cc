#include "text/components.h"

#include <nlohmann/json.hpp>

#include "text/component_util.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace offloadd::text {

AlignedText AlignedText::FromOriginal(std::string_view s, uint32_t base, bool at_start) {
  AlignedText t;
  t.text = std::string(s);
  t.orig.resize(s.size());
  for (size_t i = 0; i < s.size(); ++i) t.orig[i] = base + static_cast<uint32_t>(i);
  t.at_start = at_start;
  return t;
}

AlignedText AlignedText::Slice(size_t begin, size_t end) const {
  AlignedText t;
  t.text = text.substr(begin, end - begin);
  t.orig.assign(orig.begin() + begin, orig.begin() + end);
  t.at_start = at_start && begin == 0;
  return t;
}

namespace detail {

std::string TypeOf(const json& j) {
  auto it = j.find("type");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "";
}

StatusOr<std::string> GetString(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) {
    return InvalidArgumentError(path + "." + key + ": missing or not a string");
  }
  return it->get<std::string>();
}

bool GetBool(const json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

StatusOr<Pattern> ParsePattern(const json& j, const std::string& path) {
  if (j.is_object() && j.contains("String") && j["String"].is_string()) {
    return Pattern{j["String"].get<std::string>(), nullptr};
  }
  if (j.is_object() && j.contains("Regex") && j["Regex"].is_string()) {
    auto re = Regex::Compile(j["Regex"].get<std::string>());
    if (!re.ok()) return re.status().WithContext(path);
    return Pattern{"", *re};
  }
  return InvalidArgumentError(path + ": expected {\"String\": ...} or {\"Regex\": ...}");
}

std::string ReplaceAll(std::string_view s, const std::vector<std::pair<size_t, size_t>>& m,
                       std::string_view content) {
  std::string out;
  size_t last = 0;
  for (const auto& [b, e] : m) {
    out.append(s.substr(last, b - last));
    out.append(content);
    last = e;
  }
  out.append(s.substr(last));
  return out;
}

StatusOr<PrependScheme> ParsePrependScheme(const json& j, const std::string& path) {
  auto it = j.find("prepend_scheme");
  if (it == j.end() || it->is_null()) {
    return GetBool(j, "add_prefix_space", true) ? PrependScheme::kAlways : PrependScheme::kNever;
  }
  const std::string s = it->is_string() ? it->get<std::string>() : "";
  if (s == "always") return PrependScheme::kAlways;
  if (s == "first") return PrependScheme::kFirst;
  if (s == "never") return PrependScheme::kNever;
  return InvalidArgumentError(path + ".prepend_scheme: unsupported value \"" + s + "\"");
}

StatusOr<uint32_t> SingleCodePoint(const std::string& s, const std::string& path) {
  size_t pos = 0;
  if (s.empty()) return InvalidArgumentError(path + ": must be one character");
  const uint32_t cp = NextCodePoint(s, &pos);
  if (pos != s.size()) return InvalidArgumentError(path + ": must be one character");
  return cp;
}

}  // namespace detail

namespace {

using detail::GetBool;
using detail::GetString;
using detail::json;
using detail::MakeList;
using detail::ParsePattern;
using detail::ParsePrependScheme;
using detail::Pattern;
using detail::PrependScheme;
using detail::SingleCodePoint;
using detail::TypeOf;

// The GPT-2 pre-tokenization regex that ByteLevel{use_regex: true} applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kMetaspace = "\xE2\x96\x81";  // U+2581

// Replaces each match by `content`; the new bytes are aligned with the match's first byte.
void ReplaceAligned(AlignedText* t, const std::vector<std::pair<size_t, size_t>>& m,
                    std::string_view content) {
  if (m.empty()) return;
  AlignedText out;
  out.at_start = t->at_start;
  size_t last = 0;
  for (const auto& [b, e] : m) {
    out.text.append(t->text, last, b - last);
    out.orig.insert(out.orig.end(), t->orig.begin() + last, t->orig.begin() + b);
    out.text.append(content);
    const uint32_t anchor =
        b < t->orig.size() ? t->orig[b] : (t->orig.empty() ? 0 : t->orig.back());
    out.orig.insert(out.orig.end(), content.size(), anchor);
    last = e;
  }
  out.text.append(t->text, last, std::string::npos);
  out.orig.insert(out.orig.end(), t->orig.begin() + last, t->orig.end());
  *t = std::move(out);
}

void PrependAligned(AlignedText* t, std::string_view prefix) {
  const uint32_t anchor = t->orig.empty() ? 0 : t->orig.front();
  t->text.insert(0, prefix);
  t->orig.insert(t->orig.begin(), prefix.size(), anchor);
}

// ---------------------------------------------------------------------------------------------
// Normalizers

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> s) : steps_(std::move(s)) {}
  Status Normalize(AlignedText* t) const override {
    for (const auto& n : steps_) RETURN_IF_ERROR(n->Normalize(t));
    return OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prepend_(std::move(p)) {}
  Status Normalize(AlignedText* t) const override {
    if (!t->text.empty()) PrependAligned(t, prepend_);
    return OkStatus();
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Pattern p, std::string c) : pattern_(std::move(p)), content_(std::move(c)) {}
  Status Normalize(AlignedText* t) const override {
    std::vector<std::pair<size_t, size_t>> m;
    RETURN_IF_ERROR(pattern_.FindAll(t->text, &m));
    ReplaceAligned(t, m, content_);
    return OkStatus();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm f) : form_(f) {}
  // Normalizes chunk by chunk between normalization boundaries, so each output byte can be
  // aligned with the start of the chunk that produced it.
  Status Normalize(AlignedText* t) const override {
    ASSIGN_OR_RETURN(std::string whole, text::Normalize(t->text, form_));
    if (whole == t->text) return OkStatus();
    AlignedText out;
    out.at_start = t->at_start;
    size_t chunk = 0;
    for (size_t pos = 0; pos <= t->text.size();) {
      size_t next = pos;
      const bool end = pos == t->text.size();
      if (!end) {
        const uint32_t cp = NextCodePoint(t->text, &next);
        if (pos == chunk || !HasBoundaryBefore(cp, form_)) {
          pos = next;
          continue;
        }
      }
      ASSIGN_OR_RETURN(
          std::string piece,
          text::Normalize(std::string_view(t->text).substr(chunk, pos - chunk), form_));
      out.text += piece;
      out.orig.insert(out.orig.end(), piece.size(), t->orig[chunk]);
      chunk = pos;
      if (end) break;
      pos = next;
    }
    *t = std::move(out);
    return OkStatus();
  }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  Status Normalize(AlignedText* t) const override {
    ASSIGN_OR_RETURN(std::string lower, Lowercase(t->text));
    if (lower.size() != t->text.size()) {
      // Length changed (rare: e.g. U+0130): align everything with the first character.
      t->orig.assign(lower.size(), t->orig.empty() ? 0 : t->orig.front());
    }
    t->text = std::move(lower);
    return OkStatus();
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  Status Normalize(AlignedText* t) const override {
    const std::string* s = &t->text;
    size_t begin = 0, end = s->size();
    if (left_) {
      while (begin < end) {
        size_t p = begin;
        if (!IsUnicodeWhitespace(NextCodePoint(*s, &p))) break;
        begin = p;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t b = end - 1;
        while (b > begin && (static_cast<unsigned char>((*s)[b]) & 0xC0) == 0x80) --b;
        size_t p = b;
        if (!IsUnicodeWhitespace(NextCodePoint(*s, &p))) break;
        end = b;
      }
    }
    const bool at_start = t->at_start && begin == 0;
    *t = t->Slice(begin, end);
    t->at_start = at_start;
    return OkStatus();
  }

 private:
  bool left_, right_;
};

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

StatusOr<SplitBehavior> ParseBehavior(const json& j, const std::string& path) {
  ASSIGN_OR_RETURN(const std::string b, GetString(j, "behavior", path));
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return InvalidArgumentError(path + ".behavior: unsupported split behavior \"" + b + "\"");
}

// Splits `piece` around `matches` the way NormalizedString::split does in `tokenizers`.
void SplitPiece(const PreToken& piece, const std::vector<std::pair<size_t, size_t>>& matches,
                bool invert, SplitBehavior behavior, std::vector<PreToken>* out) {
  struct Span {
    size_t b, e;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t last = 0;
  for (const auto& [b, e] : matches) {
    if (b > last) spans.push_back({last, b, invert});
    spans.push_back({b, e, !invert});
    last = e;
  }
  if (last < piece.text.size()) spans.push_back({last, piece.text.size(), invert});

  std::vector<Span> merged;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      merged = spans;
      break;
    case SplitBehavior::kRemoved:
      for (const auto& s : spans) {
        if (!s.is_match) merged.push_back(s);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const auto& s : spans) {
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().e = s.e;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty()) {
          merged.back().b = it->b;
        } else {
          merged.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (const auto& s : spans) {
        if (s.is_match == previous_match && !merged.empty()) {
          merged.back().e = s.e;
        } else {
          merged.push_back(s);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& s : merged) {
    if (s.e > s.b) out->push_back(piece.Slice(s.b, s.e));
  }
}

// Runs `fn(piece, &out)` on every piece.
template <typename Fn>
Status ForEachPiece(std::vector<PreToken>* pieces, Fn fn) {
  std::vector<PreToken> out;
  out.reserve(pieces->size() * 2);
  for (auto& p : *pieces) RETURN_IF_ERROR(fn(p, &out));
  *pieces = std::move(out);
  return OkStatus();
}

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> s)
      : steps_(std::move(s)) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& p : steps_) RETURN_IF_ERROR(p->PreTokenize(pieces));
    return OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Pattern p, SplitBehavior b, bool invert)
      : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return ForEachPiece(pieces, [&](PreToken& p, std::vector<PreToken>* out) {
      std::vector<std::pair<size_t, size_t>> m;
      RETURN_IF_ERROR(pattern_.FindAll(p.text, &m));
      SplitPiece(p, m, invert_, behavior_, out);
      return OkStatus();
    });
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::shared_ptr<const Regex> re)
      : add_prefix_space_(add_prefix_space), regex_(std::move(re)) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return ForEachPiece(pieces, [&](PreToken& p, std::vector<PreToken>* out) {
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) PrependAligned(&p, " ");
      const size_t first = out->size();
      if (regex_) {
        std::vector<std::pair<size_t, size_t>> m;
        RETURN_IF_ERROR(regex_->FindAll(p.text, &m));
        SplitPiece(p, m, false, SplitBehavior::kIsolated, out);
      } else if (!p.text.empty()) {
        out->push_back(std::move(p));
      }
      for (size_t i = first; i < out->size(); ++i) {
        PreToken& q = (*out)[i];
        std::vector<uint32_t> orig;
        orig.reserve(q.text.size() * 2);
        for (size_t k = 0; k < q.text.size(); ++k) {
          orig.insert(orig.end(), ByteToCodePoint(static_cast<uint8_t>(q.text[k])) < 0x80 ? 1 : 2,
                      q.orig[k]);
        }
        q.text = ByteLevelEncode(q.text);
        q.orig = std::move(orig);
      }
      return OkStatus();
    });
  }

 private:
  bool add_prefix_space_;
  std::shared_ptr<const Regex> regex_;  // null when use_regex is false
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return ForEachPiece(pieces, [&](PreToken& p, std::vector<PreToken>* out) {
      std::vector<std::pair<size_t, size_t>> spaces;
      RETURN_IF_ERROR((Pattern{" ", nullptr}.FindAll(p.text, &spaces)));
      ReplaceAligned(&p, spaces, replacement_);
      const bool starts = p.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && p.at_start))) {
        PrependAligned(&p, replacement_);
      }
      if (!split_) {
        if (!p.text.empty()) out->push_back(std::move(p));
        return OkStatus();
      }
      std::vector<std::pair<size_t, size_t>> m;
      RETURN_IF_ERROR((Pattern{replacement_, nullptr}.FindAll(p.text, &m)));
      SplitPiece(p, m, false, SplitBehavior::kMergedWithNext, out);
      return OkStatus();
    });
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

}  // namespace

StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const json& j, const std::string& path) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object()) return InvalidArgumentError(path + ": expected an object");
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(auto steps, MakeList<Normalizer>(j, "normalizers", path, MakeNormalizer));
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type == "Prepend") {
    ASSIGN_OR_RETURN(std::string p, GetString(j, "prepend", path));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(p)));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(Pattern p, ParsePattern(j.value("pattern", json()), path + ".pattern"));
    ASSIGN_OR_RETURN(std::string c, GetString(j, "content", path));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(p), std::move(c)));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkd));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(GetBool(j, "strip_left", true), GetBool(j, "strip_right", true)));
  }
  return UnimplementedError(path + ": unsupported normalizer type \"" + type + "\"");
}

StatusOr<std::unique_ptr<PreTokenizer>> MakePreTokenizer(const json& j, const std::string& path) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!j.is_object()) return InvalidArgumentError(path + ": expected an object");
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(auto steps,
                     MakeList<PreTokenizer>(j, "pretokenizers", path, MakePreTokenizer));
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "ByteLevel") {
    std::shared_ptr<const Regex> re;
    if (GetBool(j, "use_regex", true)) {
      auto compiled = Regex::Compile(kGpt2Pattern);
      if (!compiled.ok()) return compiled.status().WithContext(path);
      re = *compiled;
    }
    return std::unique_ptr<PreTokenizer>(
        new ByteLevelPreTokenizer(GetBool(j, "add_prefix_space", false), std::move(re)));
  }
  if (type == "Split") {
    ASSIGN_OR_RETURN(Pattern p, ParsePattern(j.value("pattern", json()), path + ".pattern"));
    ASSIGN_OR_RETURN(SplitBehavior b, ParseBehavior(j, path));
    return std::unique_ptr<PreTokenizer>(
        new SplitPreTokenizer(std::move(p), b, GetBool(j, "invert", false)));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string r, GetString(j, "replacement", path));
    RETURN_IF_ERROR(SingleCodePoint(r, path + ".replacement").status());
    ASSIGN_OR_RETURN(PrependScheme scheme, ParsePrependScheme(j, path));
    return std::unique_ptr<PreTokenizer>(
        new MetaspacePreTokenizer(std::move(r), scheme, GetBool(j, "split", true)));
  }
  if (type == "Digits") {
    auto re = Regex::Compile(R"(\p{N})");
    if (!re.ok()) return re.status().WithContext(path);
    const bool individual = GetBool(j, "individual_digits", false);
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(
        Pattern{"", *re}, individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
        false));
  }
  return UnimplementedError(path + ": unsupported pre-tokenizer type \"" + type + "\"");
}

}  // namespace offloadd::text
