// Decoders and post-processors of tokenizer.json (see components.h).

#include <cctype>
#include <nlohmann/json.hpp>

#include "text/component_util.h"
#include "text/components.h"
#include "text/unicode.h"

namespace offloadd::text {

namespace {

using detail::GetString;
using detail::json;
using detail::MakeList;
using detail::ParsePattern;
using detail::ParsePrependScheme;
using detail::Pattern;
using detail::PrependScheme;
using detail::ReplaceAll;
using detail::SingleCodePoint;
using detail::TypeOf;

// ---------------------------------------------------------------------------------------------
// Decoders

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> s) : steps_(std::move(s)) {}
  Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& d : steps_) RETURN_IF_ERROR(d->DecodeChain(tokens));
    return OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ByteLevelDecoder final : public Decoder {
 public:
  Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    for (const auto& t : *tokens) {
      // A token with a character outside the byte alphabet (e.g. an added token) is kept as its
      // own UTF-8 bytes.
      std::string mapped;
      bool all = true;
      for (size_t pos = 0; pos < t.size() && all;) {
        const int b = CodePointToByte(NextCodePoint(t, &pos));
        if (b < 0)
          all = false;
        else
          mapped.push_back(static_cast<char>(b));
      }
      bytes += all ? mapped : t;
    }
    *tokens = {Utf8Lossy(bytes)};
    return OkStatus();
  }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
    };
    for (auto& t : *tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' && std::isxdigit(t[3]) &&
          std::isxdigit(t[4])) {
        byte = std::stoi(t.substr(3, 2), nullptr, 16);
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    *tokens = std::move(out);
    return OkStatus();
  }
};

class FuseDecoder final : public Decoder {
 public:
  Status DecodeChain(std::vector<std::string>* tokens) const override {
    std::string all;
    for (const auto& t : *tokens) all += t;
    *tokens = {std::move(all)};
    return OkStatus();
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(uint32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      std::vector<uint32_t> cps;
      for (size_t pos = 0; pos < t.size();) cps.push_back(NextCodePoint(t, &pos));
      size_t begin = 0, end = cps.size();
      for (size_t i = 0; i < start_ && i < cps.size() && cps[i] == content_; ++i) begin = i + 1;
      for (size_t i = 0; i < stop_ && i < cps.size() && cps[cps.size() - 1 - i] == content_; ++i) {
        end = cps.size() - 1 - i;
      }
      std::string s;
      for (size_t i = begin; i < end; ++i) AppendUtf8(cps[i], &s);
      t = std::move(s);
    }
    return OkStatus();
  }

 private:
  uint32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Pattern p, std::string c) : pattern_(std::move(p)), content_(std::move(c)) {}
  Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (auto& t : *tokens) {
      std::vector<std::pair<size_t, size_t>> m;
      RETURN_IF_ERROR(pattern_.FindAll(t, &m));
      if (!m.empty()) t = ReplaceAll(t, m, content_);
    }
    return OkStatus();
  }

 private:
  Pattern pattern_;
  std::string content_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  Status DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& t = (*tokens)[i];
      std::string out;
      for (size_t pos = 0; pos < t.size();) {
        const size_t b = pos;
        NextCodePoint(t, &pos);
        if (t.compare(b, pos - b, replacement_) == 0) {
          if (!(i == 0 && scheme_ != PrependScheme::kNever)) out.push_back(' ');
        } else {
          out.append(t, b, pos - b);
        }
      }
      t = std::move(out);
    }
    return OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

// ---------------------------------------------------------------------------------------------
// Post-processors

class TemplatePostProcessor final : public PostProcessor {
 public:
  // Each item is either a list of special ids or the marker for the sequence ($A).
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  explicit TemplatePostProcessor(std::vector<Item> items) : items_(std::move(items)) {}
  void Process(std::vector<int32_t>* ids, std::vector<uint32_t>* offsets,
               uint32_t end_offset) const override {
    std::vector<int32_t> out;
    bool after = false;
    std::vector<uint32_t> out_offsets;
    out.reserve(ids->size() + 4);
    out_offsets.reserve(ids->size() + 4);
    for (const auto& item : items_) {
      if (item.is_sequence) {
        out.insert(out.end(), ids->begin(), ids->end());
        out_offsets.insert(out_offsets.end(), offsets->begin(), offsets->end());
        after = true;
      } else {
        out.insert(out.end(), item.ids.begin(), item.ids.end());
        out_offsets.insert(out_offsets.end(), item.ids.size(), after ? end_offset : 0);
      }
    }
    *ids = std::move(out);
    *offsets = std::move(out_offsets);
  }

 private:
  std::vector<Item> items_;
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> s)
      : steps_(std::move(s)) {}
  void Process(std::vector<int32_t>* ids, std::vector<uint32_t>* offsets,
               uint32_t end_offset) const override {
    for (const auto& p : steps_) p->Process(ids, offsets, end_offset);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

class NoopPostProcessor final : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*, std::vector<uint32_t>*, uint32_t) const override {}
};

}  // namespace

StatusOr<std::unique_ptr<Decoder>> MakeDecoder(const json& j, const std::string& path) {
  if (j.is_null()) return std::unique_ptr<Decoder>();
  if (!j.is_object()) return InvalidArgumentError(path + ": expected an object");
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(auto steps, MakeList<Decoder>(j, "decoders", path, MakeDecoder));
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    ASSIGN_OR_RETURN(std::string c, GetString(j, "content", path));
    ASSIGN_OR_RETURN(uint32_t cp, SingleCodePoint(c, path + ".content"));
    const auto start = j.value("start", 0), stop = j.value("stop", 0);
    if (start < 0 || stop < 0) return InvalidArgumentError(path + ": start/stop must be >= 0");
    return std::unique_ptr<Decoder>(
        new StripDecoder(cp, static_cast<size_t>(start), static_cast<size_t>(stop)));
  }
  if (type == "Replace") {
    ASSIGN_OR_RETURN(Pattern p, ParsePattern(j.value("pattern", json()), path + ".pattern"));
    ASSIGN_OR_RETURN(std::string c, GetString(j, "content", path));
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(p), std::move(c)));
  }
  if (type == "Metaspace") {
    ASSIGN_OR_RETURN(std::string r, GetString(j, "replacement", path));
    RETURN_IF_ERROR(SingleCodePoint(r, path + ".replacement").status());
    ASSIGN_OR_RETURN(PrependScheme scheme, ParsePrependScheme(j, path));
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(std::move(r), scheme));
  }
  return UnimplementedError(path + ": unsupported decoder type \"" + type + "\"");
}

StatusOr<std::unique_ptr<PostProcessor>> MakePostProcessor(const json& j, const std::string& path) {
  if (j.is_null()) return std::unique_ptr<PostProcessor>();
  if (!j.is_object()) return InvalidArgumentError(path + ": expected an object");
  const std::string type = TypeOf(j);
  if (type == "Sequence") {
    ASSIGN_OR_RETURN(auto steps, MakeList<PostProcessor>(j, "processors", path, MakePostProcessor));
    return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(steps)));
  }
  if (type == "ByteLevel") return std::unique_ptr<PostProcessor>(new NoopPostProcessor());
  if (type == "TemplateProcessing") {
    auto single = j.find("single");
    if (single == j.end() || !single->is_array()) {
      return InvalidArgumentError(path + ".single: missing or not an array");
    }
    const json specials = j.value("special_tokens", json::object());
    std::vector<TemplatePostProcessor::Item> items;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string ipath = path + ".single[" + std::to_string(i) + "]";
      if (item.contains("Sequence")) {
        items.push_back({true, {}});
      } else if (item.contains("SpecialToken") && item["SpecialToken"].contains("id")) {
        const std::string name = item["SpecialToken"]["id"].get<std::string>();
        auto sp = specials.find(name);
        if (sp == specials.end() || !sp->contains("ids") || !(*sp)["ids"].is_array()) {
          return InvalidArgumentError(ipath + ": special token \"" + name +
                                      "\" missing from special_tokens");
        }
        items.push_back({false, (*sp)["ids"].get<std::vector<int32_t>>()});
      } else {
        return InvalidArgumentError(ipath + ": expected Sequence or SpecialToken");
      }
    }
    return std::unique_ptr<PostProcessor>(new TemplatePostProcessor(std::move(items)));
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    auto pair_id = [&](const char* key) -> StatusOr<int32_t> {
      auto it = j.find(key);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer()) {
        return InvalidArgumentError(path + "." + key + ": expected [token, id]");
      }
      return (*it)[1].get<int32_t>();
    };
    ASSIGN_OR_RETURN(int32_t cls, pair_id("cls"));
    ASSIGN_OR_RETURN(int32_t sep, pair_id("sep"));
    return std::unique_ptr<PostProcessor>(
        new TemplatePostProcessor({{false, {cls}}, {true, {}}, {false, {sep}}}));
  }
  return UnimplementedError(path + ": unsupported post-processor type \"" + type + "\"");
}

}  // namespace offloadd::text
