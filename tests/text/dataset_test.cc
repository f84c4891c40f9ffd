// Unit tests of record splitting, record errors and the batcher on small in-memory data.
// Parity with Python references on real data lives in tests/python/text/test_dataset.py.

#include "text/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tests/text/toy_tokenizer.h"
#include "text/batcher.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace offloadd::text {
namespace {

TEST(SplitRecords, ArrayElementsKeepTheirLines) {
  auto r = SplitRecords("[\n  {\"a\": \"x]\\\"\"},\n  {\"b\": [1, {\"c\": 2}]}\n]\n", "f.json");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].line, 2u);
  EXPECT_EQ((*r)[0].text, "{\"a\": \"x]\\\"\"}");
  EXPECT_EQ((*r)[1].line, 3u);
  auto jsonl = SplitRecords("{\"a\": 1}\n\n  \n{\"b\": 2}", "f.jsonl");
  ASSERT_TRUE(jsonl.ok());
  ASSERT_EQ(jsonl->size(), 2u);
  EXPECT_EQ((*jsonl)[1].line, 4u);
  auto bad = SplitRecords("[{\"a\": 1},\n{\"b\": ", "f.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("f.json:2:"), std::string::npos) << bad.status().ToString();
  auto empty = SplitRecords("[ ]", "f.json");
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
}

using test_util::ToyTokenizer;

TEST(RecordEncoder, FormatsAndErrors) {
  auto tok = ToyTokenizer();
  DatasetOptions options;
  auto enc = RecordEncoder::Create(*tok, nullptr, options);
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  auto doc = enc->Encode(nlohmann::ordered_json::parse(R"({"prompt": "ab", "completion": " ab"})"));
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ(doc->input_ids, (std::vector<int32_t>{3, 2, 3, 4}));
  EXPECT_EQ(doc->labels, (std::vector<int32_t>{kIgnoreIndex, 2, 3, 4}));
  doc = enc->Encode(nlohmann::ordered_json::parse(R"({"input_ids": [0, 1], "labels": [-100, 1]})"));
  ASSERT_TRUE(doc.ok());
  EXPECT_EQ(doc->labels, (std::vector<int32_t>{kIgnoreIndex, 1}));
  for (const char* bad :
       {R"({"input_ids": [0, 7]})", R"({"input_ids": [0], "labels": [1, 2]})",
        R"({"instruction": "a"})", R"({"foo": 1})", R"([1, 2])",
        R"({"conversations": [{"from": "alien", "value": "x"}]})", R"({"messages": []})"}) {
    EXPECT_FALSE(enc->Encode(nlohmann::ordered_json::parse(bad)).ok()) << bad;
  }
}

// OpenAI's per-message "weight": an assistant message with weight 0 is rendered but not trained;
// weight 1 is the default; a weight elsewhere, or of another value, is an error naming it.
TEST(RecordEncoder, PerMessageWeightZeroIsNotTrained) {
  auto tok = ToyTokenizer();
  for (bool mask_prompt : {true, false}) {
    DatasetOptions options;
    options.mask_prompt = mask_prompt;
    auto enc = RecordEncoder::Create(*tok, nullptr, options);
    ASSERT_TRUE(enc.ok()) << enc.status().ToString();
    auto conversation = [](const char* w1, const char* w2) {
      return nlohmann::ordered_json::parse(std::string(R"({"messages": [{"role": "user", "content": "a"},
        {"role": "assistant", "content": "ab")") + w1 + R"(}, {"role": "user", "content": "b"},
        {"role": "assistant", "content": "ba")" + w2 + "}]}");
    };
    auto plain = enc->Encode(conversation("", ""));
    auto ones = enc->Encode(conversation(R"(, "weight": 1)", R"(, "weight": 1)"));
    auto first_off = enc->Encode(conversation(R"(, "weight": 0)", ""));
    ASSERT_TRUE(plain.ok() && ones.ok() && first_off.ok()) << first_off.status().ToString();
    EXPECT_EQ(ones->labels, plain->labels);
    EXPECT_EQ(first_off->input_ids, plain->input_ids) << "the turn is still rendered";
    auto trained = [](const Document& d) {
      return std::count_if(d.labels.begin(), d.labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
    };
    EXPECT_GT(trained(*plain), trained(*first_off));
    EXPECT_GT(trained(*first_off), 0) << "the second assistant turn is still trained";
    // Nothing that was not trained without weights becomes trained.
    for (size_t i = 0; i < plain->labels.size(); ++i) {
      if (plain->labels[i] == kIgnoreIndex) {
        EXPECT_EQ(first_off->labels[i], kIgnoreIndex) << i;
      }
    }
  }
  DatasetOptions options;
  auto enc = RecordEncoder::Create(*tok, nullptr, options);
  for (const char* bad : {R"({"messages": [{"role": "user", "content": "a", "weight": 0},
                                           {"role": "assistant", "content": "b"}]})",
                          R"({"messages": [{"role": "user", "content": "a"},
                                           {"role": "assistant", "content": "b", "weight": 0.5}]})",
                          R"({"messages": [{"role": "user", "content": "a"},
                                           {"role": "assistant", "content": "b", "weight": "no"}]})"}) {
    auto r = enc->Encode(nlohmann::ordered_json::parse(bad));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(std::string(r.status().message()).find("weight"), std::string::npos) << r.status().ToString();
  }
}

// TRL's conversational prompt/completion: rendered as one conversation; with mask_prompt only the
// completion's assistant turns are trained (an assistant turn in the prompt is context).
TEST(RecordEncoder, ConversationalPromptCompletion) {
  auto tok = ToyTokenizer();
  DatasetOptions options;
  options.mask_prompt = true;
  auto enc = RecordEncoder::Create(*tok, nullptr, options);
  ASSERT_TRUE(enc.ok());
  using J = nlohmann::ordered_json;
  auto pc = enc->Encode(J::parse(R"({"prompt": [{"role": "user", "content": "a"}],
                                     "completion": [{"role": "assistant", "content": "ab"}]})"));
  auto msgs = enc->Encode(J::parse(R"({"messages": [{"role": "user", "content": "a"},
                                                    {"role": "assistant", "content": "ab"}]})"));
  ASSERT_TRUE(pc.ok() && msgs.ok()) << pc.status().ToString();
  EXPECT_EQ(pc->input_ids, msgs->input_ids);
  EXPECT_EQ(pc->labels, msgs->labels);
  // A multi-turn prompt: its assistant turn is not trained, the completion's is.
  auto multi = enc->Encode(J::parse(R"({"prompt": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "ab"}, {"role": "user", "content": "b"}],
      "completion": [{"role": "assistant", "content": "ba"}]})"));
  auto all = enc->Encode(J::parse(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "content": "ab"}, {"role": "user", "content": "b"},
      {"role": "assistant", "content": "ba"}]})"));
  ASSERT_TRUE(multi.ok() && all.ok()) << multi.status().ToString();
  EXPECT_EQ(multi->input_ids, all->input_ids);
  auto trained = [](const Document& d) {
    return std::count_if(d.labels.begin(), d.labels.end(), [](int32_t l) { return l != kIgnoreIndex; });
  };
  EXPECT_GT(trained(*multi), 0);
  EXPECT_LT(trained(*multi), trained(*all));
  auto mixed = enc->Encode(J::parse(R"({"prompt": "a", "completion": [{"role": "assistant", "content": "b"}]})"));
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(std::string(mixed.status().message()).find("conversational"), std::string::npos);
}

// ShareGPT's function_call / observation turns and OpenAI's tool_calls render through the
// template's own tool-call syntax (here a Qwen-like <tool_call> block), the bare function schemas
// of ShareGPT's "tools" are wrapped as {"type": "function", "function": ...}, string arguments are
// decoded, and the call is trained while the tool result is not.
// ../shared/data's GPT-2 tokenizer.json (the tool-call tests skip without the shared data).
std::filesystem::path SharedGpt2Tokenizer() {
  const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
  return std::filesystem::path(src != nullptr ? src : ".") / ".." / "shared" / "data" /
         "tokenizers" / "gpt2" / "tokenizer.json";
}

TEST(RecordEncoder, ToolCallsRenderThroughTheTemplate) {
  const auto gpt2 = SharedGpt2Tokenizer();
  if (!std::filesystem::exists(gpt2)) GTEST_SKIP() << "shared data not found at " << gpt2;
  auto tok = Tokenizer::FromFile(gpt2.string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  SpecialTokens tokens;
  tokens.eos_token = "<|endoftext|>";
  auto tmpl = ChatTemplate::FromString(
      "{% for t in tools %}[{{ t.type }}:{{ t.function.name }}]{{ '\\n' }}{% endfor %}"
      "{% for m in messages %}{{ m.role }}: {{ m.content }}{% if m.tool_calls %}"
      "{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}"
      "</tool_call>{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}",
      tokens);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  auto enc = RecordEncoder::Create(**tok, &*tmpl, DatasetOptions());
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  using J = nlohmann::ordered_json;
  auto sharegpt = enc->Encode(J::parse(R"({"conversations": [
      {"from": "human", "value": "weather?"},
      {"from": "function_call", "value": "{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}"},
      {"from": "observation", "value": "cold"}, {"from": "gpt", "value": "It is cold."}],
      "tools": "[{\"name\": \"get\", \"parameters\": {}}]"})"));
  auto openai = enc->Encode(J::parse(R"({"messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
       "function": {"name": "get", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "content": "cold"}, {"role": "assistant", "content": "It is cold."}],
      "tools": [{"type": "function", "function": {"name": "get", "parameters": {}}}]})"));
  ASSERT_TRUE(sharegpt.ok()) << sharegpt.status().ToString();
  ASSERT_TRUE(openai.ok()) << openai.status().ToString();
  EXPECT_EQ(sharegpt->input_ids, openai->input_ids);
  EXPECT_EQ(sharegpt->labels, openai->labels);
  auto text = (*tok)->Decode(sharegpt->input_ids, false);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "[function:get]\nuser: weather?\nassistant: <tool_call>get {\"city\": \"Oslo\"}"
            "</tool_call>\ntool: cold\nassistant: It is cold.\n");
  std::vector<int32_t> trained;
  for (int32_t l : sharegpt->labels) {
    if (l != kIgnoreIndex) trained.push_back(l);
  }
  auto trained_text = (*tok)->Decode(trained, false);
  ASSERT_TRUE(trained_text.ok());
  EXPECT_EQ(*trained_text, " <tool_call>get {\"city\": \"Oslo\"}</tool_call>\n It is cold.\n");
  // A function_call that is not a call, and string arguments that are not an object, are errors
  // naming the turn.
  auto bad = enc->Encode(J::parse(R"j({"conversations": [{"from": "human", "value": "a"},
      {"from": "function_call", "value": "get(1)"}]})j"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("conversations[1]"), std::string::npos)
      << bad.status().ToString();
  bad = enc->Encode(J::parse(R"({"messages": [{"role": "user", "content": "a"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("messages[1].tool_calls[0]"),
            std::string::npos) << bad.status().ToString();
}

// A template without tool-call syntax never reads "tool_calls": a ShareGPT call is trained as the
// assistant's JSON text, as it was written, and an OpenAI message carrying calls is refused
// (rendered by such a template its calls would vanish from the training text).
TEST(RecordEncoder, ToolCallsWithATemplateWithoutToolSyntax) {
  const auto gpt2 = SharedGpt2Tokenizer();
  if (!std::filesystem::exists(gpt2)) GTEST_SKIP() << "shared data not found at " << gpt2;
  auto tok = Tokenizer::FromFile(gpt2.string());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  SpecialTokens tokens;
  tokens.eos_token = "<|endoftext|>";
  auto tmpl = ChatTemplate::FromString(
      "{% for m in messages %}{{ m.role }}: {{ m.content }}{{ '\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}assistant:{% endif %}",
      tokens);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  ASSERT_FALSE(tmpl->reads_tool_calls());
  auto enc = RecordEncoder::Create(**tok, &*tmpl, DatasetOptions());
  ASSERT_TRUE(enc.ok()) << enc.status().ToString();
  using J = nlohmann::ordered_json;
  auto sharegpt = enc->Encode(J::parse(R"({"conversations": [
      {"from": "human", "value": "weather?"},
      {"from": "function_call", "value": "{\"name\": \"get\"}"},
      {"from": "observation", "value": "cold"}]})"));
  ASSERT_TRUE(sharegpt.ok()) << sharegpt.status().ToString();
  std::vector<int32_t> trained;
  for (int32_t l : sharegpt->labels) {
    if (l != kIgnoreIndex) trained.push_back(l);
  }
  auto trained_text = (*tok)->Decode(trained, false);
  ASSERT_TRUE(trained_text.ok());
  EXPECT_EQ(*trained_text, " {\"name\": \"get\"}\n");
  auto openai = enc->Encode(J::parse(R"({"messages": [{"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
       "function": {"name": "get", "arguments": {}}}]}]})"));
  ASSERT_FALSE(openai.ok());
  EXPECT_NE(std::string(openai.status().message()).find("messages[1] has tool_calls"),
            std::string::npos) << openai.status().ToString();
}

TEST(DatasetReader, BadLineIsAnErrorWithFileAndLineOrSkipped) {
  const std::string path = testing::TempDir() + "/bad.jsonl";
  std::ofstream(path) << "{\"text\": \"ab\"}\n{\"text\": 3}\n{\"text\": \"b\"}\n";
  auto tok = ToyTokenizer();
  DatasetOptions options;
  auto ds = DatasetReader::Load({path}, *tok, nullptr, options);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().message(), path + ":2: \"text\" must be a string");
  options.skip_bad_records = true;
  ds = DatasetReader::Load({path}, *tok, nullptr, options);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->size(), 2u);
  EXPECT_EQ(ds->stats().skipped, 1u);
  auto missing = DatasetReader::Load({"/nonexistent.jsonl"}, *tok, nullptr, options);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Parquet and Arrow files (an HF save_to_disk directory too) are read by their own readers, found
// by magic or name: broken ones are errors naming the file, never parsed as JSON or reported as
// "not a file" (parquet_reader_test.cc and arrow_ipc_reader_test.cc read real ones).
TEST(DatasetReader, BrokenParquetAndArrowFilesAreErrorsNamingThem) {
  auto tok = ToyTokenizer();
  const std::string dir = testing::TempDir() + "/columnar";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/train.parquet", std::ios::binary) << "PAR1" << std::string(16, '\0') << "PAR1";
  std::ofstream(dir + "/x.bin", std::ios::binary) << "ARROW1" << std::string(10, '\0');
  std::ofstream(dir + "/stream.bin", std::ios::binary)
      << std::string(4, '\xff') << std::string(8, '\1');
  const std::string hf = dir + "/hf_dataset";
  std::filesystem::create_directories(hf);
  std::ofstream(hf + "/dataset_info.json") << "{}";
  std::ofstream(hf + "/data-00000-of-00001.arrow") << "x";
  for (const std::string& path : {dir + "/train.parquet", dir + "/x.bin", dir + "/stream.bin",
                                  hf + "/data-00000-of-00001.arrow"}) {
    auto ds = DatasetReader::Load({path == hf + "/data-00000-of-00001.arrow" ? hf : path}, *tok,
                                  nullptr, DatasetOptions{});
    ASSERT_FALSE(ds.ok()) << path;
    EXPECT_EQ(ds.status().code(), StatusCode::kDataLoss) << ds.status().ToString();
    EXPECT_NE(ds.status().message().find(path + ": "), std::string::npos) << ds.status().message();
  }
  // A directory without Parquet shards or save_to_disk files says so.
  std::filesystem::create_directories(dir + "/plain");
  auto plain = DatasetReader::Load({dir + "/plain"}, *tok, nullptr, DatasetOptions{});
  ASSERT_FALSE(plain.ok());
  EXPECT_NE(plain.status().message().find("/plain: a directory without *.parquet files"),
            std::string::npos)
      << plain.status().message();
}

std::shared_ptr<std::vector<Document>> Docs(const std::vector<size_t>& lengths) {
  auto docs = std::make_shared<std::vector<Document>>();
  for (size_t i = 0; i < lengths.size(); ++i) {
    Document d;
    for (size_t k = 0; k < lengths[i]; ++k) {
      d.input_ids.push_back(static_cast<int32_t>(100 * i + k));
      d.labels.push_back(static_cast<int32_t>(100 * i + k));
    }
    docs->push_back(d);
  }
  return docs;
}

TEST(Batcher, PacksGreedilyWithPerDocumentPositionsAndBoundaries) {
  BatcherOptions o;
  o.max_seq_length = 8;
  o.shuffle = false;
  auto b = Batcher::Create(Docs({3, 4, 2, 10}), o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  PackedSequence s = b->Next();
  EXPECT_EQ(s.input_ids, (std::vector<int32_t>{0, 1, 2, 100, 101, 102, 103}));
  EXPECT_EQ(s.labels, (std::vector<int32_t>{kIgnoreIndex, 1, 2, kIgnoreIndex, 101, 102, 103}));
  EXPECT_EQ(s.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 3}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 3, 7}));
  EXPECT_EQ(s.document_ids, (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 1}));
  s = b->Next();  // the 2-token doc, then the 10-token doc does not fit
  EXPECT_EQ(s.sources, (std::vector<uint64_t>{2}));
  s = b->Next();  // truncated to 8
  EXPECT_EQ(s.input_ids.size(), 8u);
  EXPECT_EQ(b->stats().truncated, 1u);
  EXPECT_EQ(b->cursor(), (Cursor{0, 4}));  // end of epoch 0; the next call starts epoch 1
  s = b->Next();
  EXPECT_EQ(s.sources, (std::vector<uint64_t>{0, 1}));
}

TEST(Batcher, ShuffleIsAPermutationDeterministicPerSeedAndEpoch) {
  auto a = Batcher::EpochOrder(100, 42, 0, true);
  EXPECT_EQ(a, Batcher::EpochOrder(100, 42, 0, true));
  EXPECT_NE(a, Batcher::EpochOrder(100, 42, 1, true));
  EXPECT_NE(a, Batcher::EpochOrder(100, 43, 0, true));
  std::vector<uint32_t> sorted = a;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, Batcher::EpochOrder(100, 0, 0, false));
}

TEST(Batcher, SaveAndRestoreResumeExactly) {
  BatcherOptions o;
  o.max_seq_length = 6;
  o.seed = 5;
  auto docs = Docs({1, 2, 3, 4, 5, 6, 2, 3});
  auto b = Batcher::Create(docs, o);
  ASSERT_TRUE(b.ok());
  std::vector<PackedSequence> first;
  std::string state;
  for (int i = 0; i < 12; ++i) {
    if (i == 5) state = b->SaveState();
    first.push_back(b->Next());
  }
  auto c = Batcher::Create(docs, o);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->RestoreState(state).ok());
  for (int i = 5; i < 12; ++i) EXPECT_EQ(c->Next().input_ids, first[i].input_ids) << i;
  BatcherOptions other = o;
  other.seed = 6;
  auto d = Batcher::Create(docs, other);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->RestoreState(state).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(d->RestoreState("{oops").code(), StatusCode::kInvalidArgument);
}

TEST(Batcher, RejectsUnusableInput) {
  BatcherOptions o;
  o.max_seq_length = 2;
  o.drop_overlong = true;
  EXPECT_FALSE(Batcher::Create(Docs({3, 4}), o).ok());
  o.max_seq_length = 0;
  EXPECT_FALSE(Batcher::Create(Docs({1}), o).ok());
  EXPECT_FALSE(Batcher::Create(std::make_shared<std::vector<Document>>(), BatcherOptions{}).ok());
}

TEST(EvalSplit, HeldOutRecordsAreDeterministicBySeedDisjointAndComplete) {
  std::vector<Document> docs(1000);
  for (size_t i = 0; i < docs.size(); ++i) docs[i].input_ids = {static_cast<int32_t>(i)};
  const std::vector<size_t> a = HeldOutIndices(1000, 0.05, 42);
  EXPECT_EQ(a.size(), 50u);                      // ceil(1000 * 0.05)
  EXPECT_EQ(a, HeldOutIndices(1000, 0.05, 42));  // the same seed, the same records
  EXPECT_NE(a, HeldOutIndices(1000, 0.05, 43));  // another seed, others
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  EXPECT_GT(a.back(), 900u);  // chosen across the file, not its first records
  EXPECT_EQ(HeldOutIndices(10, 0.01, 1).size(), 1u);  // at least one
  EXPECT_EQ(HeldOutIndices(2, 0.5, 1).size(), 1u);    // at most n - 1
  EXPECT_TRUE(HeldOutIndices(1, 0.5, 1).empty());

  auto eval = SplitHeldOut(docs, 0.05, 42, /*held_out=*/true);
  auto train = SplitHeldOut(docs, 0.05, 42, /*held_out=*/false);
  ASSERT_TRUE(eval.ok() && train.ok());
  ASSERT_EQ(eval->size(), 50u);
  ASSERT_EQ(train->size(), 950u);
  std::vector<int32_t> seen;
  for (const Document& d : *eval) seen.push_back(d.input_ids[0]);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(seen[k], static_cast<int32_t>(a[k]));
  for (const Document& d : *train) seen.push_back(d.input_ids[0]);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());  // disjoint
  EXPECT_EQ(seen.size(), 1000u);                                        // and complete
  auto one = SplitHeldOut(std::vector<Document>(1), 0.5, 1, true);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.status().message().find("at least 2 records"), std::string::npos);
}

}  // namespace
}  // namespace offloadd::text
