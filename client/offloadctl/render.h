#pragma once
// Human-readable rendering of API messages for offloadctl.

#include <string>

#include "offloadd/v1/job_service.pb.h"
#include "offloadd/v1/node_service.pb.h"

namespace offloadctl {

std::string Upper(std::string s);
std::string RenderNodeInfo(const offloadd::v1::NodeInfo& n);
std::string RenderJob(const offloadd::v1::Job& j);
std::string RenderJobList(const offloadd::v1::ListJobsResponse& r);
std::string RenderEvent(const offloadd::v1::JobEvent& e);

}  // namespace offloadctl
