#pragma once
// offloadctl's exit statuses: one place, so `offloadctl --help`, docs/offloadctl.md and the code
// cannot disagree. Scripts branch on these; a value, once given, keeps its meaning.

#include "common/status.h"
#include "offloadd/v1/job.pb.h"

namespace offloadctl {

enum ExitCode : int {
  kExitOk = 0,           // done; a job that was waited for SUCCEEDED
  kExitJobFailed = 1,    // a job that was waited for (watch, submit --watch, get --wait) FAILED
  kExitUsage = 2,        // bad command line: unknown flag or command, bad value, missing job file
  kExitJobCancelled = 3, // a job that was waited for was CANCELLED
  kExitNotFound = 4,     // no such job or checkpoint (gRPC NOT_FOUND)
  kExitUnreachable = 5,  // the daemon cannot be reached or is not serving (UNAVAILABLE,
                         // DEADLINE_EXCEEDED, health NOT_SERVING)
  kExitInvalid = 6,      // the job file or request is invalid (parse error, INVALID_ARGUMENT)
  kExitError = 7,        // any other error (PERMISSION_DENIED, FAILED_PRECONDITION, ...);
                         // the message names the gRPC code
};

// The "Exit status" section of `offloadctl --help`.
inline constexpr const char* kExitCodeHelp =
    "Exit status:\n"
    "  0  success; a job that was waited for succeeded\n"
    "  1  a job that was waited for (watch, submit --watch, get --wait) failed\n"
    "  2  usage error: unknown command or flag, bad value, missing job file\n"
    "  3  a job that was waited for was cancelled\n"
    "  4  job or checkpoint not found\n"
    "  5  daemon unreachable or not serving (unavailable, deadline exceeded)\n"
    "  6  invalid job file or request (refused as INVALID_ARGUMENT)\n"
    "  7  any other error (permission denied, failed precondition, internal, ...)\n";

// The exit status for a failed call (`code` != kOk).
inline int ExitCodeFor(offloadd::StatusCode code) {
  switch (code) {
    case offloadd::StatusCode::kOk: return kExitOk;
    case offloadd::StatusCode::kNotFound: return kExitNotFound;
    case offloadd::StatusCode::kUnavailable:
    case offloadd::StatusCode::kDeadlineExceeded: return kExitUnreachable;
    case offloadd::StatusCode::kInvalidArgument:
    case offloadd::StatusCode::kOutOfRange: return kExitInvalid;
    default: return kExitError;
  }
}

// The exit status for a job that was waited for, as it ended.
inline int ExitCodeForJobState(offloadd::v1::JobState state) {
  switch (state) {
    case offloadd::v1::JOB_STATE_SUCCEEDED: return kExitOk;
    case offloadd::v1::JOB_STATE_CANCELLED: return kExitJobCancelled;
    default: return kExitJobFailed;
  }
}

}  // namespace offloadctl
