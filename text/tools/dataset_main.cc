// offloadd-dataset: loads a dataset with a tokenizer and prints documents or packed sequences as
// JSON lines (first line: {"stats": ...}). For inspecting data and for the parity tests.
//
//   offloadd-dataset --tokenizer DIR --data FILE [--data FILE ...] [--format NAME]
//       [--no-mask-prompt] [--skip-bad-records] [--no-eos] [--builtin-template]
//       [--pack N --max-seq-length L [--no-packing] [--no-shuffle] [--seed S] [--pad-id ID]
//        [--drop-overlong] [--restore STATE_JSON]]
//
// DIR holds tokenizer.json and optionally tokenizer_config.json / chat_template.jinja.
// Exit status 1 with the error on stderr when loading fails (e.g. "file:line: what").

#include <charconv>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "text/batcher.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace {

int Fail(const std::string& msg) {
  std::cerr << "offloadd-dataset: " << msg << "\n";
  return 1;
}

}  // namespace

int Run(int argc, char** argv);

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {  // bad numeric arguments (std::stoi) and the like
    return Fail(e.what());
  }
}

int Run(int argc, char** argv) {
  using namespace offloadd::text;
  std::string dir, restore;
  std::vector<std::string> files;
  DatasetOptions options;
  BatcherOptions batch;
  long pack = -1;
  bool builtin = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    // A whole-string integer flag value; std::stoi would throw (and abort) on "x" or 1e30.
    bool bad_number = false;
    auto number = [&](auto* out) {
      const std::string v = value();
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), *out);
      bad_number = ec != std::errc() || end != v.data() + v.size() || v.empty();
    };
    if (a == "--tokenizer")
      dir = value();
    else if (a == "--data")
      files.push_back(value());
    else if (a == "--format") {
      auto f = ParseDatasetFormat(value());
      if (!f.ok()) return Fail(f.status().message());
      options.format = *f;
    } else if (a == "--no-mask-prompt")
      options.mask_prompt = false;
    else if (a == "--skip-bad-records")
      options.skip_bad_records = true;
    else if (a == "--no-eos")
      options.add_eos = false;
    else if (a == "--builtin-template")
      builtin = true;
    else if (a == "--pack")
      pack = [&] { int64_t p = 0; number(&p); return p; }();
    else if (a == "--max-seq-length")
      number(&batch.max_seq_length);
    else if (a == "--no-packing")
      batch.packing = false;
    else if (a == "--no-shuffle")
      batch.shuffle = false;
    else if (a == "--seed")
      number(&batch.seed);
    else if (a == "--pad-id")
      batch.pad_id = [&] { int32_t p = 0; number(&p); return p; }();
    else if (a == "--drop-overlong")
      batch.drop_overlong = true;
    else if (a == "--restore")
      restore = value();
    else
      return Fail("unknown argument " + a);
    if (bad_number) return Fail(a + ": expected an integer in range, got '" + argv[i] + "'");
  }
  if (dir.empty() || files.empty()) return Fail("--tokenizer and --data are required");
  auto tok = Tokenizer::FromDirectory(dir);
  if (!tok.ok()) return Fail(tok.status().ToString());
  std::optional<ChatTemplate> tmpl;
  if (!builtin) {
    auto t = ChatTemplate::FromDirectory(dir);
    if (t.ok()) {
      tmpl = std::move(*t);
    } else if (t.status().code() != offloadd::StatusCode::kNotFound) {
      return Fail(t.status().ToString());
    }
  }
  if (!tmpl && std::filesystem::exists(dir + "/tokenizer_config.json")) {
    auto tokens = SpecialTokens::FromTokenizerConfig(dir + "/tokenizer_config.json");
    if (!tokens.ok()) return Fail(tokens.status().ToString());
    tmpl = ChatTemplate::BuiltIn(*tokens);
  }
  auto ds = DatasetReader::Load(files, **tok, tmpl ? &*tmpl : nullptr, options);
  if (!ds.ok()) return Fail(ds.status().ToString());
  const DatasetStats& st = ds->stats();
  std::cout << nlohmann::json{{"stats",
                               {{"records", st.records},
                                {"documents", ds->size()},
                                {"skipped", st.skipped},
                                {"tokens", st.tokens},
                                {"trained_tokens", st.trained_tokens},
                                {"first_errors", st.first_errors}}}}
                   .dump()
            << "\n";
  if (pack < 0) {
    for (size_t i = 0; i < ds->size(); ++i) {
      const Document& d = ds->document(i);
      std::cout << nlohmann::json{{"input_ids", d.input_ids}, {"labels", d.labels}}.dump() << "\n";
    }
    return 0;
  }
  auto b = Batcher::Create(ds->documents(), batch);
  if (!b.ok()) return Fail(b.status().ToString());
  if (!restore.empty()) {
    offloadd::Status s = b->RestoreState(restore);
    if (!s.ok()) return Fail(s.ToString());
  }
  for (long i = 0; i < pack; ++i) {
    PackedSequence seq = b->Next();
    std::cout << nlohmann::json{{"input_ids", seq.input_ids},
                                {"labels", seq.labels},
                                {"position_ids", seq.position_ids},
                                {"cu_seqlens", seq.cu_seqlens},
                                {"document_ids", seq.document_ids},
                                {"sources", seq.sources},
                                {"state", nlohmann::json::parse(b->SaveState())}}
                     .dump()
              << "\n";
  }
  std::cerr << "truncated=" << b->stats().truncated << " dropped=" << b->stats().dropped << "\n";
  return 0;
}
