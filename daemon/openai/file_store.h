#pragma once
// The OpenAI API's uploaded files: POST /v1/files stores a JSONL training file under
// <data_dir>/files/<id>.jsonl with its record beside it (<id>.json: name, size, purpose, owner,
// records), after checking every line is a chat record in OpenAI's format
// ({"messages": [{"role", "content"}, ...]} with at least one assistant message). Jobs then name
// the file by id, and read it as a dataset of format `messages`. Thread-safe.

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/file_identity.h"
#include "common/status.h"

namespace offloadd::daemon::openai {

struct StoredFile {
  std::string id;  // "file-<24 hex digits>"
  uint64_t bytes = 0;
  int64_t created_at = 0;  // Unix seconds
  std::string filename;
  std::string purpose;  // "fine-tune"
  std::string owner;    // the client that uploaded it
  int64_t records = 0;  // chat records (non-blank lines)
  std::string path;     // the JSONL file
};

// Checks every line of `data` is an OpenAI chat record; returns how many records there are, or
// INVALID_ARGUMENT naming the first bad line and what is wrong with it.
StatusOr<int64_t> CheckChatJsonl(std::string_view data);

class FileStore {
 public:
  // `dir` is created when missing, and given `mode`.
  static StatusOr<std::unique_ptr<FileStore>> Open(const std::string& dir, mode_t mode = 0700);

  // Checks and stores an upload. `identity` (a token's user= when the daemon runs as root): the
  // file is given to that user, so that the job, which reads it with the user's rights, can.
  StatusOr<StoredFile> Create(const std::string& filename, const std::string& purpose,
                              std::string_view data, const std::string& owner,
                              const std::optional<FileIdentity>& identity);
  // NOT_FOUND naming the id.
  StatusOr<StoredFile> Get(const std::string& id);
  // Newest first.
  StatusOr<std::vector<StoredFile>> List();

 private:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  std::mutex mu_;
  std::string dir_;
};

}  // namespace offloadd::daemon::openai
