#include "daemon/openai/file_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "common/file.h"

namespace offloadd::daemon::openai {
namespace {

using nlohmann::json;

std::string NewFileId() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::random_device rd;
  std::string id = "file-";
  for (int i = 0; i < 24; ++i) id += kHex[rd() % 16];
  return id;
}

bool ValidId(const std::string& id) {
  if (id.size() != 29 || id.rfind("file-", 0) != 0) return false;
  return std::all_of(id.begin() + 5, id.end(),
                     [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

// Writes `data` to a new file (never through an existing one or a symlink), 0600.
Status WriteNew(const std::string& path, std::string_view data,
                const std::optional<FileIdentity>& identity) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "cannot create " + path);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      unlink(path.c_str());
      return ErrnoError(err, "cannot write " + path);
    }
    done += static_cast<size_t>(n);
  }
  if (identity && fchown(fd, identity->uid, identity->gid) != 0) {
    const int err = errno;
    close(fd);
    unlink(path.c_str());
    return ErrnoError(err, "cannot give " + path + " to " + identity->Describe());
  }
  if (fsync(fd) != 0 || close(fd) != 0) return ErrnoError(errno, "cannot write " + path);
  return OkStatus();
}

json ToJson(const StoredFile& f) {
  return {{"id", f.id},
          {"bytes", f.bytes},
          {"created_at", f.created_at},
          {"filename", f.filename},
          {"purpose", f.purpose},
          {"owner", f.owner},
          {"records", f.records}};
}

StatusOr<StoredFile> FromJson(const std::string& text, const std::string& dir) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return DataLossError("file record is not a JSON object");
  StoredFile f;
  try {
    f.id = j.at("id").get<std::string>();
    f.bytes = j.at("bytes").get<uint64_t>();
    f.created_at = j.at("created_at").get<int64_t>();
    f.filename = j.at("filename").get<std::string>();
    f.purpose = j.at("purpose").get<std::string>();
    f.owner = j.at("owner").get<std::string>();
    f.records = j.at("records").get<int64_t>();
  } catch (const json::exception& e) {
    return DataLossError(std::string("file record: ") + e.what());
  }
  f.path = dir + "/" + f.id + ".jsonl";
  return f;
}

Status CheckMessage(const json& m, size_t index, bool* assistant) {
  const std::string at = "messages[" + std::to_string(index) + "]";
  if (!m.is_object()) return InvalidArgumentError(at + " is not an object");
  static const std::set<std::string> kRoles = {"system", "developer", "user", "assistant", "tool"};
  const auto role = m.find("role");
  if (role == m.end() || !role->is_string() || !kRoles.count(role->get<std::string>())) {
    return InvalidArgumentError(at +
                                ".role must be one of system, developer, user, assistant, tool");
  }
  const auto content = m.find("content");
  const bool is_assistant = role->get<std::string>() == "assistant";
  *assistant = *assistant || is_assistant;
  if (content == m.end() || content->is_null()) {
    if (is_assistant && m.contains("tool_calls")) return OkStatus();
    return InvalidArgumentError(at + ".content is missing");
  }
  if (!content->is_string()) {
    return InvalidArgumentError(at + ".content must be a string (content parts are not supported)");
  }
  return OkStatus();
}

}  // namespace

StatusOr<int64_t> CheckChatJsonl(std::string_view data) {
  int64_t records = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < data.size();) {
    const size_t eol = std::min(data.find('\n', pos), data.size());
    const std::string_view line = data.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = "line " + std::to_string(line_no) + ": ";
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded()) return InvalidArgumentError(where + "not valid JSON");
    if (!j.is_object()) return InvalidArgumentError(where + "not a JSON object");
    const auto messages = j.find("messages");
    if (messages == j.end() || !messages->is_array() || messages->empty()) {
      return InvalidArgumentError(where +
                                  "expected {\"messages\": [...]} with at least one message "
                                  "(OpenAI's chat format)");
    }
    bool assistant = false;
    for (size_t i = 0; i < messages->size(); ++i) {
      if (Status s = CheckMessage((*messages)[i], i, &assistant); !s.ok()) {
        return InvalidArgumentError(where + s.message());
      }
    }
    if (!assistant) return InvalidArgumentError(where + "no assistant message to train on");
    ++records;
  }
  if (records == 0) return InvalidArgumentError("the file holds no records");
  return records;
}

StatusOr<std::unique_ptr<FileStore>> FileStore::Open(const std::string& dir, mode_t mode) {
  RETURN_IF_ERROR(MakeDirs(dir));
  if (chmod(dir.c_str(), mode) != 0) return ErrnoError(errno, "cannot set the mode of " + dir);
  return std::unique_ptr<FileStore>(new FileStore(dir));
}

StatusOr<StoredFile> FileStore::Create(const std::string& filename, const std::string& purpose,
                                       std::string_view data, const std::string& owner,
                                       const std::optional<FileIdentity>& identity) {
  ASSIGN_OR_RETURN(int64_t records, CheckChatJsonl(data));
  StoredFile f;
  f.id = NewFileId();
  f.bytes = data.size();
  f.created_at = std::chrono::duration_cast<std::chrono::seconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  f.filename = filename;
  f.purpose = purpose;
  f.owner = owner;
  f.records = records;
  f.path = dir_ + "/" + f.id + ".jsonl";
  std::lock_guard<std::mutex> lock(mu_);
  RETURN_IF_ERROR(WriteNew(f.path, data, identity));
  // The record last: a file without one is not listed (a crash between the two leaves an orphan).
  if (Status s = WriteNew(dir_ + "/" + f.id + ".json", ToJson(f).dump(), std::nullopt); !s.ok()) {
    unlink(f.path.c_str());
    return s;
  }
  return f;
}

StatusOr<StoredFile> FileStore::Get(const std::string& id) {
  if (!ValidId(id)) return NotFoundError("no such file: '" + id + "'");
  auto text = ReadFile(dir_ + "/" + id + ".json");
  if (!text.ok()) return NotFoundError("no such file: '" + id + "'");
  return FromJson(*text, dir_);
}

StatusOr<std::vector<StoredFile>> FileStore::List() {
  std::vector<StoredFile> files;
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return ErrnoError(errno, "cannot list " + dir_);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() != 34 || name.substr(29) != ".json") continue;
    auto f = Get(name.substr(0, 29));
    if (f.ok()) files.push_back(std::move(*f));
  }
  closedir(d);
  std::sort(files.begin(), files.end(), [](const StoredFile& a, const StoredFile& b) {
    return a.created_at != b.created_at ? a.created_at > b.created_at : a.id > b.id;
  });
  return files;
}

}  // namespace offloadd::daemon::openai
