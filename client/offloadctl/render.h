#pragma once
// Human-readable rendering of API messages for offloadctl.

#include <string>

#include "offloadd/v1/job_service.pb.h"
#include "offloadd/v1/node_service.pb.h"

namespace offloadctl {

std::string Upper(std::string s);
// "succeeded" for JOB_STATE_SUCCEEDED.
std::string JobStateName(offloadd::v1::JobState s);
std::string RenderNodeInfo(const offloadd::v1::NodeInfo& n);
std::string RenderJob(const offloadd::v1::Job& j);
std::string RenderJobList(const offloadd::v1::ListJobsResponse& r);
std::string RenderEvent(const offloadd::v1::JobEvent& e);
// One status line for a terminal: "step 120/1000 [####......]  12%  loss 2.3412  lr 3.0e-04
// 1234 tok/s  ETA 0:12:34" with a bar `bar_width` characters wide.
std::string RenderProgressLine(const offloadd::v1::JobProgress& p, int bar_width = 24);

}  // namespace offloadctl
