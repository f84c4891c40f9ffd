// offloadd-tokenize: runs the native tokenizer over JSON lines, for scripts and parity tests.
//
//   offloadd-tokenize --tokenizer DIR_OR_TOKENIZER_JSON < requests.jsonl > replies.jsonl
//
// A tokenizer.json file is used as is (Python `tokenizers` semantics); a directory is loaded
// like transformers' AutoTokenizer (Tokenizer::FromDirectory, honouring tokenizer_config.json).
//
// Each request line is one of
//   {"text": "...", "add_special_tokens": true}    -> {"ids": [...]}
//   {"text": "...", "offsets": true}               -> {"ids": [...], "starts": [byte offsets]}
//   {"ids": [...], "skip_special_tokens": false}   -> {"text": "..."}
// and a request that fails yields {"error": "..."} (the tool keeps going). Exit status 1 when the
// tokenizer cannot be loaded (the message goes to stderr).

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "text/tokenizer.h"

int main(int argc, char** argv) {
  std::string path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--tokenizer" && i + 1 < argc) {
      path = argv[++i];
    } else {
      std::cerr << "usage: offloadd-tokenize --tokenizer DIR_OR_TOKENIZER_JSON < requests.jsonl\n";
      return 2;
    }
  }
  if (path.empty()) {
    std::cerr << "offloadd-tokenize: --tokenizer is required\n";
    return 2;
  }
  auto tok = std::filesystem::is_directory(path) ? offloadd::text::Tokenizer::FromDirectory(path)
                                                 : offloadd::text::Tokenizer::FromFile(path);
  if (!tok.ok()) {
    std::cerr << "offloadd-tokenize: " << tok.status().ToString() << "\n";
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line.empty()) continue;
    nlohmann::json req = nlohmann::json::parse(line, nullptr, false);
    nlohmann::json reply;
    try {
      if (req.is_discarded() || !req.is_object()) {
        reply["error"] = "request is not a JSON object";
      } else if (req.contains("text") && req["text"].is_string()) {
        auto enc = (*tok)->EncodeWithOffsets(req["text"].get<std::string>(),
                                             req.value("add_special_tokens", false));
        if (!enc.ok()) {
          reply["error"] = enc.status().ToString();
        } else {
          reply["ids"] = enc->ids;
          if (req.value("offsets", false)) reply["starts"] = enc->starts;
        }
      } else if (req.contains("ids") && req["ids"].is_array()) {
        std::vector<int32_t> ids;
        for (const auto& v : req["ids"]) ids.push_back(v.get<int32_t>());
        auto text = (*tok)->Decode(ids, req.value("skip_special_tokens", false));
        if (text.ok())
          reply["text"] = *text;
        else
          reply["error"] = text.status().ToString();
      } else {
        reply["error"] = "request needs \"text\" or \"ids\"";
      }
    } catch (const nlohmann::json::exception& e) {
      reply = {{"error", std::string("bad request: ") + e.what()}};
    }
    std::cout << reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
