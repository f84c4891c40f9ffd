// Fuzzes job files (client/cpp/job_file.h): YAML or JSON with job.proto's field names, short
// enum spellings, as offloadctl and the C++ SDK read them. The input is the file's text.
// A spec that parses must survive a protobuf round trip (serialize, parse) unchanged (compared
// field by field: map entries serialize in no fixed order, so the bytes may differ).

#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/util/message_differencer.h>

#include "client/cpp/job_file.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  auto spec = offloadd::client::ParseJobSpec(yaml, "job.yaml");
  if (!spec.ok()) return 0;
  std::string bytes;
  FUZZ_CHECK(spec->SerializeToString(&bytes));
  offloadd::v1::JobSpec back;
  FUZZ_CHECK(back.ParseFromString(bytes));
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(*spec, back));
  return 0;
}
