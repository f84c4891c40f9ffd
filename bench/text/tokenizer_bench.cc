// offloadd-tokenizer-bench: load time and encode throughput of the native tokenizer.
//
//   offloadd-tokenizer-bench --tokenizer FILE_OR_DIR --corpus FILE [--repeats N] [--threads T]
//
// The corpus is a JSON array of objects (every string field becomes one text, e.g. Alpaca) or a
// text file (one text per line). Prints one JSON object: load_s, texts, bytes, tokens, and for
// the first (cold cache) and later (warm) single-thread passes and a T-thread pass: seconds,
// MB/s and tokens/s.

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "text/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a) {
  return std::chrono::duration<double>(Clock::now() - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string tok_path, corpus;
  int repeats = 3, threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer")
      tok_path = argv[i + 1];
    else if (a == "--corpus")
      corpus = argv[i + 1];
    else if (a == "--repeats")
      repeats = std::stoi(argv[i + 1]);
    else if (a == "--threads")
      threads = std::stoi(argv[i + 1]);
  }
  if (tok_path.empty() || corpus.empty()) {
    std::cerr << "usage: offloadd-tokenizer-bench --tokenizer FILE_OR_DIR --corpus FILE "
                 "[--repeats N] [--threads T]\n";
    return 2;
  }
  std::ifstream in(corpus, std::ios::binary);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string contents = buf.str();
  std::vector<std::string> texts;
  nlohmann::json j = nlohmann::json::parse(contents, nullptr, false);
  if (!j.is_discarded() && j.is_array()) {
    for (const auto& rec : j) {
      if (!rec.is_object()) continue;
      for (const auto& [k, v] : rec.items()) {
        if (v.is_string() && !v.get<std::string>().empty()) texts.push_back(v.get<std::string>());
      }
    }
  } else {
    std::string line;
    std::istringstream lines(contents);
    while (std::getline(lines, line)) texts.push_back(line);
  }
  size_t bytes = 0;
  for (const auto& t : texts) bytes += t.size();

  auto t0 = Clock::now();
  auto tok = std::filesystem::is_directory(tok_path)
                 ? offloadd::text::Tokenizer::FromDirectory(tok_path)
                 : offloadd::text::Tokenizer::FromFile(tok_path);
  const double load_s = Seconds(t0);
  if (!tok.ok()) {
    std::cerr << tok.status().ToString() << "\n";
    return 1;
  }
  auto pass = [&](size_t begin, size_t step, size_t* tokens) {
    for (size_t i = begin; i < texts.size(); i += step) {
      auto ids = (*tok)->Encode(texts[i], false);
      if (ids.ok()) *tokens += ids->size();
    }
  };
  nlohmann::json out = {{"load_s", load_s}, {"texts", texts.size()}, {"bytes", bytes}};
  auto report = [&](const char* name, double s, size_t tokens) {
    out[name] = {{"seconds", s}, {"MB_per_s", bytes / s / 1e6}, {"tokens_per_s", tokens / s}};
    out["tokens"] = tokens;
  };
  size_t tokens = 0;
  t0 = Clock::now();
  pass(0, 1, &tokens);
  report("cold_1_thread", Seconds(t0), tokens);
  double best = 1e9;
  for (int r = 0; r < repeats; ++r) {
    tokens = 0;
    t0 = Clock::now();
    pass(0, 1, &tokens);
    best = std::min(best, Seconds(t0));
  }
  report("warm_1_thread", best, tokens);
  std::vector<size_t> counts(static_cast<size_t>(threads));
  t0 = Clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back(pass, static_cast<size_t>(t), static_cast<size_t>(threads), &counts[t]);
  }
  for (auto& th : pool) th.join();
  tokens = 0;
  for (size_t c : counts) tokens += c;
  report(("warm_" + std::to_string(threads) + "_threads").c_str(), Seconds(t0), tokens);
  std::cout << out.dump(2) << "\n";
  return 0;
}
