#pragma once
// The OpenAI-compatible fine-tuning API (docs/openai_api.md): server.openai_api.listen serves
// /v1/files and /v1/fine_tuning/jobs over HTTP (or HTTPS), each call authenticated by a bearer
// token of the token file (on a Unix socket: by the caller's user), and translated onto the
// JobManager (JobManager::Submit, the admission path gRPC's CreateJob takes) and the uploaded-file
// store. A thin frontend: jobs created here are ordinary jobs (offloadctl and the SDKs see them),
// and jobs created through gRPC are listed here. Thread-safe.

#include <memory>
#include <string>

#include "common/status.h"
#include "daemon/config/config.h"
#include "daemon/jobs/job_manager.h"

namespace offloadd::daemon::openai {

class OpenAiApi {
 public:
  // Reads the token file, opens the file store under data_dir and listens. `jobs` must outlive
  // the API. Errors name the setting at fault.
  static StatusOr<std::unique_ptr<OpenAiApi>> Start(const DaemonConfig& config, JobManager* jobs);
  ~OpenAiApi();
  int port() const;  // 0 on a Unix socket
  // Where clients point base_url, for the log: "http(s)://host:port/v1", or the socket.
  std::string url() const;
  // Stops serving: no new requests; those being handled finish.
  void Shutdown();

 private:
  struct Impl;
  explicit OpenAiApi(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Startup checks of the OpenAI API's settings (CheckStartup and --validate-config): the token
// file is readable and well formed (on TCP), the TLS certificate and key load and match, and
// data_dir lies under allowed_roots.
Status CheckOpenAiApi(const DaemonConfig& config);

}  // namespace offloadd::daemon::openai
