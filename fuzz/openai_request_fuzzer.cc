// Fuzzes what the OpenAI-compatible API reads from a client (daemon/openai/): the first byte picks
//   0: an upload: Content-Type, NUL, the multipart body -> MultipartBoundary, ParseMultipart, and
//      CheckChatJsonl on the "file" part;
//   1: a POST /v1/fine_tuning/jobs body -> SpecFromRequest (model names looked up in
//      examples/data, "file-a" an uploaded file), then JobJson of the job it would be;
//   else: a JSONL upload -> CheckChatJsonl.
// Checks: every part's body lies inside the input; an accepted upload has records; an accepted
// request names the model, the file and an output directory under the root; every refusal names
// a message and makes a JSON error body that parses; every object shown is valid JSON.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/openai/file_store.h"
#include "daemon/openai/multipart.h"
#include "daemon/openai/openai_jobs.h"
#include "fuzz/fuzz_util.h"

namespace openai = offloadd::daemon::openai;
using nlohmann::json;

namespace {

void CheckErrorBody(const openai::ApiError& e) {
  FUZZ_CHECK(!e.message.empty());
  const json body = json::parse(openai::ErrorBody(e), nullptr, false);
  FUZZ_CHECK(body.is_object() && body["error"]["message"].is_string());
}

void Upload(std::string_view input) {
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return;
  auto boundary = openai::MultipartBoundary(std::string(input.substr(0, nul)));
  if (!boundary.ok()) return;
  const std::string_view body = input.substr(nul + 1);
  auto parts = openai::ParseMultipart(body, *boundary);
  if (!parts.ok()) return;
  for (const openai::FormPart& p : *parts) {
    FUZZ_CHECK(p.body.data() >= body.data() &&
               p.body.data() + p.body.size() <= body.data() + body.size());
    FUZZ_CHECK(!p.name.empty());
    if (p.name == "file") {
      auto records = openai::CheckChatJsonl(p.body);
      FUZZ_CHECK(!records.ok() || *records > 0);
    }
  }
}

void CreateRequest(std::string_view input) {
  openai::JobRequestContext context;
  context.model_dir = offloadd::fuzz::SourceDir() + "/examples/data";
  context.output_root = "/fuzz/out";
  context.file = [](const std::string& id) -> offloadd::StatusOr<openai::StoredFile> {
    if (id == "file-a")
      return openai::StoredFile{id, 10, 1, "a.jsonl", "fine-tune", "x", 5, "/fuzz/a.jsonl"};
    return offloadd::NotFoundError("no such file: '" + id + "'");
  };
  auto spec = openai::SpecFromRequest(std::string(input), context);
  if (auto* e = std::get_if<openai::ApiError>(&spec)) {
    CheckErrorBody(*e);
    return;
  }
  const offloadd::v1::JobSpec& s = std::get<offloadd::v1::JobSpec>(spec);
  FUZZ_CHECK(!s.model().path().empty());
  FUZZ_CHECK(s.dataset().paths_size() == 1 && s.dataset().paths(0) == "/fuzz/a.jsonl");
  FUZZ_CHECK(s.output_dir().rfind("/fuzz/out/ft-", 0) == 0);
  // One component under the root ("ft-..."), so never a way out of it.
  FUZZ_CHECK(s.output_dir().find('/', 10) == std::string::npos);
  offloadd::v1::Job job;
  *job.mutable_spec() = s;
  const json shown = json::parse(
      openai::JobJson(job).dump(-1, ' ', false, json::error_handler_t::replace), nullptr, false);
  FUZZ_CHECK(shown.is_object() && shown["object"] == "fine_tuning.job");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0]) {
    case 0:
      Upload(input);
      break;
    case 1:
      CreateRequest(input);
      break;
    default: {
      auto records = openai::CheckChatJsonl(input);
      FUZZ_CHECK(!records.ok() || *records > 0);
      break;
    }
  }
  return 0;
}
