#pragma once
// offloadd C++ SDK: a typed client for the daemon's gRPC API over the Unix socket or TCP+TLS.
//
//   auto client = offloadd::client::Client::Connect({.target = "unix:///run/offloadd/offloadd.sock"});
//   auto info = (*client)->GetNodeInfo();
//
// Errors come back as offloadd::Status with the server's gRPC code and message; field violations
// from google.rpc.BadRequest details are appended to the message, one per line, and available
// structured through last_field_violations(). A Client is thread-safe (gRPC stubs are); the
// last_field_violations() accessor reflects the most recent failing call of any thread.

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "offloadd/v1/job_service.pb.h"
#include "offloadd/v1/node_service.pb.h"

namespace offloadd::client {

inline constexpr const char* kDefaultTarget = "unix:///run/offloadd/offloadd.sock";

struct ConnectOptions {
  // "unix:///path/to.sock", "unix:/path" or "host:port" (TCP requires tls_ca_file + token).
  std::string target = kDefaultTarget;
  // PEM file of the CA that signed the daemon's TLS certificate (TCP only).
  std::string tls_ca_file;
  // Override the name checked against the certificate (TCP only; e.g. when connecting by IP).
  std::string tls_server_name;
  // File holding the bearer token (TCP only).
  std::string auth_token_file;
  // Per-call deadline for unary calls.
  std::chrono::milliseconds timeout{30000};
  // How long Client::Wait keeps trying to reopen a broken watch stream (daemon restarting,
  // connection dropped) before it gives up; the clock restarts whenever an event arrives.
  std::chrono::milliseconds reconnect_window{60000};
};

struct FieldViolation {
  std::string field;
  std::string description;
};

enum class HealthStatus { kUnknown, kServing, kNotServing, kServiceUnknown };
const char* HealthStatusName(HealthStatus s);

class Client {
 public:
  static StatusOr<std::unique_ptr<Client>> Connect(const ConnectOptions& options);
  ~Client();

  // grpc.health.v1 Check for `service` ("" = the whole server).
  StatusOr<HealthStatus> CheckHealth(const std::string& service = "");
  StatusOr<offloadd::v1::NodeInfo> GetNodeInfo();

  StatusOr<offloadd::v1::Job> CreateJob(const offloadd::v1::JobSpec& spec, bool validate_only = false);
  StatusOr<offloadd::v1::Job> GetJob(const std::string& job_id);
  StatusOr<offloadd::v1::ListJobsResponse> ListJobs(const offloadd::v1::ListJobsRequest& request);
  // `force`: the daemon kills the job's processes at once instead of asking them to stop.
  StatusOr<offloadd::v1::Job> CancelJob(const std::string& job_id, const std::string& reason = "",
                                        bool force = false);
  StatusOr<offloadd::v1::Job> PauseJob(const std::string& job_id);
  // Removes an ended job's record; returns the job as it was (its output_dir stays).
  StatusOr<offloadd::v1::Job> DeleteJob(const std::string& job_id);
  StatusOr<offloadd::v1::Job> ResumeJob(const std::string& job_id);
  StatusOr<offloadd::v1::ListCheckpointsResponse> ListCheckpoints(const std::string& job_id);
  // One page of the job's metrics history (rows after request.after_step) or of its events.
  StatusOr<offloadd::v1::ListJobMetricsResponse> ListJobMetrics(
      const offloadd::v1::ListJobMetricsRequest& request);
  StatusOr<offloadd::v1::ListJobEventsResponse> ListJobEvents(
      const offloadd::v1::ListJobEventsRequest& request);
  // Calls on_event for each event until the stream ends (job finished) or on_event returns false.
  // One stream: a broken connection ends it with the error (see Wait for a watch that resumes).
  Status WatchJob(const offloadd::v1::WatchJobRequest& request,
                  const std::function<bool(const offloadd::v1::JobEvent&)>& on_event);

  // Waits until the job reaches a final state (SUCCEEDED, FAILED or CANCELLED) and returns it as
  // it ended. on_event (may be empty) sees each of the job's events once, in cursor order, from
  // the first. When the stream breaks (UNAVAILABLE, ABORTED, or CANCELLED by a stopping daemon)
  // Wait reopens it after the last cursor it delivered, with backoff, for up to
  // ConnectOptions::reconnect_window without news; then it returns the last error, naming the
  // cursor to resume from. `timeout` bounds the whole wait (zero: unbounded) and ends it with
  // DEADLINE_EXCEEDED. Other errors (NOT_FOUND, PERMISSION_DENIED, ...) return at once.
  StatusOr<offloadd::v1::Job> Wait(const std::string& job_id,
                                   const std::function<void(const offloadd::v1::JobEvent&)>& on_event = {},
                                   std::chrono::milliseconds timeout = std::chrono::milliseconds::zero());

  std::vector<FieldViolation> last_field_violations() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::client
