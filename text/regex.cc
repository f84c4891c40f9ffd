#include "text/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "text/onig_compat.h"
#include "text/unicode.h"

namespace offloadd::text {

namespace {

// One JIT stack per thread: the default 32 KiB machine stack overflows on long whitespace runs
// with patterns like \s+(?!\S).
struct ThreadMatchState {
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ThreadMatchState() {
    if (stack != nullptr && context != nullptr) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~ThreadMatchState() {
    pcre2_match_data_free(data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
  }
};

std::string PcreMessage(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

StatusOr<std::shared_ptr<const Regex>> Regex::Compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  // tokenizer.json patterns are Oniguruma patterns: translate the classes whose meaning differs.
  const std::string translated = OnigToPcre2(pattern);
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (code == nullptr) {
    return InvalidArgumentError("cannot compile regex /" + std::string(pattern) + "/ at offset " +
                                std::to_string(offset) + ": " + PcreMessage(err));
  }
  // JIT is an optimisation: when unavailable (e.g. an unsupported CPU) the interpreter is used.
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  std::shared_ptr<Regex> re(new Regex());
  re->pattern_ = std::string(pattern);
  re->code_ = code;
  return std::shared_ptr<const Regex>(std::move(re));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

Status Regex::FindAll(std::string_view subject, std::vector<std::pair<size_t, size_t>>* out) const {
  thread_local ThreadMatchState state;
  if (state.data == nullptr || state.context == nullptr) {
    return ResourceExhaustedError("cannot allocate PCRE2 match data");
  }
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* subj = reinterpret_cast<PCRE2_SPTR>(subject.data());
  size_t start = 0;
  while (start <= subject.size()) {
    const int rc = pcre2_match(code, subj, subject.size(), start, PCRE2_NO_UTF_CHECK, state.data,
                               state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return InternalError("regex /" + pattern_ + "/ failed: " + PcreMessage(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      out->emplace_back(b, e);
      start = e;
    } else {
      // Empty match: step over one code point so the scan always advances.
      if (b >= subject.size()) break;
      start = b + Utf8SeqLen(static_cast<unsigned char>(subject[b]));
    }
  }
  return OkStatus();
}

}  // namespace offloadd::text
