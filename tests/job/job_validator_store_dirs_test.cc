// A configured store directory that is missing was reported as "none is
// configured". The violation names the directory and says it is missing.
#include <gtest/gtest.h>

#include "job/job_validator.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

std::string DeviceViolation(const NodeBudget& node) {
  v1::JobSpec s;
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  const ValidationResult r = ValidateJobSpec(s, PathPolicy({"/tmp"}), node);
  for (const auto& v : r.violations) {
    if (v.field == "offload.offload_optimizer.device") return v.description;
  }
  return "";
}

TEST(StoreDirMessages, AMissingStoreDirectoryIsNamedNotTakenForNone) {
  NodeBudget node;
  EXPECT_NE(DeviceViolation(node).find("none is configured"), std::string::npos) << DeviceViolation(node);

  StoreDirFacts missing;
  missing.path = "/mnt/nvme-not-mounted";
  missing.problem = "missing: no such directory";
  node.unusable_store_dirs.push_back(missing);
  const std::string why = DeviceViolation(node);
  EXPECT_EQ(why.find("none is configured"), std::string::npos) << why;
  EXPECT_NE(why.find("/mnt/nvme-not-mounted"), std::string::npos) << why;
  EXPECT_NE(why.find("missing"), std::string::npos) << why;
}

}  // namespace
}  // namespace offloadd::daemon
