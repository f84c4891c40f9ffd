#include "trainer/state/export_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/file.h"
#include "common/logging.h"

namespace offloadd::trainer {

bool IsExportTemporaryName(std::string_view name) {
  constexpr std::string_view kTmp = ".tmp-";
  constexpr size_t kHex = 12;
  if (name.size() < 1 + 1 + kTmp.size() + kHex || name.front() != '.') return false;
  const size_t tmp_at = name.size() - kHex - kTmp.size();
  if (name.substr(tmp_at, kTmp.size()) != kTmp) return false;
  for (char c : name.substr(name.size() - kHex)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

StatusOr<ExportLock> ExportLock::Acquire(const std::string& output_dir) {
  ASSIGN_OR_RETURN(OwnedFd fd, MakeDirsConfined(output_dir));
  while (::flock(fd.get(), LOCK_EX) != 0) {
    if (errno != EINTR) return ErrnoError(errno, "flock " + output_dir);
  }
  return ExportLock(std::move(fd));
}

StatusOr<std::vector<std::string>> RemoveExportTemporaries(const std::string& output_dir) {
  std::vector<std::string> removed;
  if (!PathExists(output_dir)) return removed;
  ASSIGN_OR_RETURN(OwnedFd dir, OpenConfined(output_dir, O_RDONLY | O_DIRECTORY, Access::kWrite));
  if (::flock(dir.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return removed;  // an export is writing them
    return ErrnoError(errno, "flock " + output_dir);
  }
  // readdir on a second descriptor: closedir closes it, `dir` keeps the lock and the unlinks.
  const int list_fd = ::dup(dir.get());
  if (list_fd < 0) return ErrnoError(errno, "dup " + output_dir);
  DIR* d = ::fdopendir(list_fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(list_fd);
    return ErrnoError(err, "opendir " + output_dir);
  }
  Status status;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!IsExportTemporaryName(name)) continue;
    struct stat st {};
    if (::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    const std::string path = JoinPath(output_dir, name);
    if (::unlinkat(dir.get(), name.c_str(), 0) != 0) {
      if (errno != ENOENT && status.ok()) status = ErrnoError(errno, "remove " + path);
      continue;
    }
    OFFLOADD_LOG(kInfo, "checkpoint")
        << "removed " << path << " (" << st.st_size << " bytes), left by an interrupted export";
    removed.push_back(path);
  }
  ::closedir(d);
  if (!status.ok()) return status;
  return removed;
}

std::string ModelCardFacts::OffloaddVersion() {
#ifdef OFFLOADD_VERSION
  return OFFLOADD_VERSION;
#else
  return "unknown";
#endif
}

namespace {

// A YAML scalar that reads back as the same string: a JSON string is a YAML double-quoted one.
std::string Quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string Number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

// A Hub id is "name" or "owner/name" of letters, digits, '-', '_' and '.': not a path.
bool IsHubId(const std::string& s) {
  if (s.empty() || s.front() == '/' || s.front() == '.' || s.find("//") != std::string::npos) return false;
  int slashes = 0;
  for (char c : s) {
    if (c == '/') ++slashes;
    else if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) return false;
  }
  return slashes <= 1;
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::string ModelCard(const ModelCardFacts& f) {
  std::string base;
  if (!f.config_json.empty()) {
    const auto config = nlohmann::json::parse(f.config_json, nullptr, /*allow_exceptions=*/false);
    if (config.is_object() && config.contains("_name_or_path") && config["_name_or_path"].is_string()) {
      const std::string named = config["_name_or_path"].get<std::string>();
      if (IsHubId(named)) base = named;
    }
  }
  const bool hub = !base.empty();
  if (!hub) base = BaseName(f.model_dir);
  std::ostringstream o;
  o << "---\n";
  o << "library_name: transformers\n";
  o << "base_model: " << Quoted(base) << "\n";
  o << "tags:\n  - offloadd\n  - full-fine-tune\n  - generated_from_trainer\n";
  if (!f.datasets.empty()) {
    o << "datasets:\n";
    for (const auto& d : f.datasets) o << "  - " << Quoted(BaseName(d)) << "\n";
  }
  o << "model-index:\n  - name: " << Quoted(base + "-finetuned") << "\n    results: []\n";
  o << "---\n\n";
  o << "# " << base << " fine-tuned with offloadd\n\n";
  o << "This model is a full fine-tune of "
    << (hub ? "[" + base + "](https://huggingface.co/" + base + ")" : "`" + base + "`")
    << " (from `" << f.model_dir << "`)";
  if (!f.datasets.empty()) {
    o << " on ";
    for (size_t i = 0; i < f.datasets.size(); ++i) o << (i ? ", " : "") << "`" << f.datasets[i] << "`";
  }
  o << ".\n";
  if (f.eval_loss) {
    o << "It achieves the following results on the evaluation set";
    if (!f.eval_datasets.empty()) {
      o << " (";
      for (size_t i = 0; i < f.eval_datasets.size(); ++i) o << (i ? ", " : "") << "`" << f.eval_datasets[i] << "`";
      o << ")";
    }
    o << ":\n- Loss: " << Number(*f.eval_loss) << "\n";
  }
  o << "\n## Training procedure\n\n### Training hyperparameters\n\n";
  o << "The following hyperparameters were used during training:\n";
  for (const auto& [name, value] : f.hyperparameters) o << "- " << name << ": " << value << "\n";
  o << "\n### Training results\n\n";
  o << "- Steps: " << f.steps << "\n";
  if (f.tokens > 0) o << "- Tokens trained on: " << f.tokens << "\n";
  o << "- Final training loss: " << (f.final_loss ? Number(*f.final_loss) : std::string("none (no step ran)"))
    << "\n";
  if (f.eval_loss) o << "- Evaluation loss: " << Number(*f.eval_loss) << "\n";
  o << "\n### Framework versions\n\n- offloadd " << f.offloadd_version << "\n";
  return o.str();
}

}  // namespace offloadd::trainer
