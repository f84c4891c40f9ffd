// Fuzzes dataset loading in every record format (text/dataset.h): record splitting (JSON array or
// JSON lines), format detection, alpaca / sharegpt / messages / prompt-completion / text /
// pretokenized conversion, chat-template rendering with assistant spans, tokenization and label
// masking, through DatasetReader::Load on a memfd, as a job's dataset file is read.
// Input: one options byte, then the file contents. Options byte:
//   bits 0-2 format (0 auto, 1 alpaca, 2 messages, 3 sharegpt, 4 text, 5 prompt_completion,
//   6 pretokenized, 7 auto), bit 3 mask_prompt, bit 4 skip_bad_records, bit 5 add_eos,
//   bit 6 tokenizer: 0 = Phi-3 (byte fallback, its own Jinja chat template),
//                    1 = GPT-2 (byte-level BPE, the built-in template).
// The tokenizers are the real files of ../shared/data ($OFFLOADD_FUZZ_DATA), loaded once.
// Checked: every document has as many labels as ids, ids inside the vocabulary, labels either
// -100 or a token id.

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fuzz/fuzz_util.h"
#include "text/chat_template.h"
#include "text/dataset.h"
#include "text/tokenizer.h"

namespace text = offloadd::text;

namespace {

struct Setup {
  std::unique_ptr<text::Tokenizer> tokenizer;
  std::optional<text::ChatTemplate> chat;  // nullopt: the built-in template
};

Setup LoadSetup(const std::string& dir, bool with_template) {
  auto tok = text::Tokenizer::FromDirectory(dir);
  if (!tok.ok()) offloadd::fuzz::SetupFailed(tok.status().ToString());
  Setup s{std::move(*tok), std::nullopt};
  if (with_template) {
    auto chat = text::ChatTemplate::FromDirectory(dir);
    if (!chat.ok()) offloadd::fuzz::SetupFailed(chat.status().ToString());
    s.chat.emplace(std::move(*chat));
  }
  return s;
}

const Setup& GetSetup(int which) {
  static const Setup phi3 =
      LoadSetup(offloadd::fuzz::SharedDataDir() + "/tokenizers/phi3-mini", /*with_template=*/true);
  static const Setup gpt2 =
      LoadSetup(offloadd::fuzz::SharedDataDir() + "/tokenizers/gpt2", /*with_template=*/false);
  return which == 0 ? phi3 : gpt2;
}

int MemFd() {
  static const int fd = [] {
    int f = memfd_create("dataset_fuzz", MFD_CLOEXEC);
    if (f < 0) offloadd::fuzz::SetupFailed("memfd_create failed");
    return f;
  }();
  return fd;
}

constexpr text::DatasetFormat kFormats[8] = {
    text::DatasetFormat::kAuto,          text::DatasetFormat::kAlpaca,
    text::DatasetFormat::kMessages,      text::DatasetFormat::kShareGpt,
    text::DatasetFormat::kText,          text::DatasetFormat::kPromptCompletion,
    text::DatasetFormat::kPretokenized,  text::DatasetFormat::kAuto};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetSetup(0);
  GetSetup(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t opt = data[0];
  text::DatasetOptions options;
  options.format = kFormats[opt & 7];
  options.mask_prompt = opt & 8;
  options.skip_bad_records = opt & 16;
  options.add_eos = opt & 32;
  const Setup& s = GetSetup((opt >> 6) & 1);

  const int fd = MemFd();
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data + 1, size - 1, 0) != static_cast<ssize_t>(size - 1)) {
    offloadd::fuzz::SetupFailed("writing the memfd failed");
  }
  auto reader = text::DatasetReader::Load({"/proc/self/fd/" + std::to_string(fd)}, *s.tokenizer,
                                          s.chat ? &*s.chat : nullptr, options);
  if (!reader.ok()) return 0;
  const int32_t vocab = s.tokenizer->vocab_size();
  FUZZ_CHECK(reader->size() > 0);
  for (size_t i = 0; i < reader->size(); ++i) {
    const text::Document& d = reader->document(i);
    FUZZ_CHECK(d.input_ids.size() == d.labels.size());
    for (size_t k = 0; k < d.input_ids.size(); ++k) {
      FUZZ_CHECK(d.input_ids[k] >= 0 && d.input_ids[k] < vocab);
      FUZZ_CHECK(d.labels[k] == text::kIgnoreIndex || (d.labels[k] >= 0 && d.labels[k] < vocab));
    }
  }
  FUZZ_CHECK(reader->stats().skipped <= reader->stats().records);
  return 0;
}
