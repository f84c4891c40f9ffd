#include "trainer/state/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <utility>

#include "common/crc32c.h"
#include "common/file.h"
#include "common/file_identity.h"
#include "common/logging.h"
#include "common/safe_path.h"
#include "engine/safetensors.h"
#include "job/latest_checkpoint.h"
#include "trainer/state/checkpoint_state.h"
#include "trainer/state/export_files.h"

namespace offloadd::trainer {
namespace {

using checkpoint_internal::Bytes;
using checkpoint_internal::ChecksumsFromJson;
using checkpoint_internal::HeaderEntry;
using checkpoint_internal::HfStateToJson;
using checkpoint_internal::LayerFile;
using checkpoint_internal::SafetensorsPrefix;
using checkpoint_internal::StateFromJson;
using checkpoint_internal::StateToJson;
using checkpoint_internal::WriteSyncedFile;
using json = nlohmann::json;

// Layer files hold the host's floats as they are; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little,
              "checkpoints assume a little-endian host");

constexpr char kStateFile[] = "offloadd_state.json";
constexpr char kHfStateFile[] = "trainer_state.json";  // Hugging Face's schema (HfStateToJson)
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kDirPrefix[] = "checkpoint-";
constexpr char kHiddenPrefix[] = ".checkpoint-";  // writers' and pruners' temporary directories
constexpr size_t kVerifyChunk = size_t{4} << 20;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// "checkpoint-<digits>" -> step; -1 for any other name.
int64_t StepOfDirName(std::string_view name) {
  const std::string_view prefix = kDirPrefix;
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return -1;
  int64_t step = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9' || step > (std::numeric_limits<int64_t>::max() - 9) / 10) return -1;
    step = step * 10 + (c - '0');
  }
  return step;
}

template <typename T>
uint64_t TotalFloats(const std::vector<std::span<T>>& pieces) {
  uint64_t n = 0;
  for (const auto& p : pieces) n += p.size();
  return n;
}

template <typename T>
Status CheckBufferSize(const std::vector<std::span<T>>& pieces, int64_t expected,
                       const std::string& what) {
  if (TotalFloats(pieces) == static_cast<uint64_t>(expected)) return OkStatus();
  return InvalidArgumentError(what + ": buffer holds " + std::to_string(TotalFloats(pieces)) +
                              " floats, the layer's parameters need " + std::to_string(expected));
}

// Copies `src` into the flat buffer `dst` starting at float `offset`.
void Scatter(const Pieces& dst, uint64_t offset, std::span<const std::byte> src) {
  for (const std::span<float>& piece : dst) {
    if (src.empty()) return;
    if (offset >= piece.size()) {
      offset -= piece.size();
      continue;
    }
    const size_t bytes = std::min<size_t>(src.size(), (piece.size() - offset) * sizeof(float));
    std::memcpy(piece.data() + offset, src.data(), bytes);
    src = src.subspan(bytes);
    offset = 0;
  }
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%08x", v);
  return buf;
}

// Flocks the opened directory `fd` (non-blocking) and checks that it is still what `path` names
// once locked (`stat_path` stats what is there now), so a lock on a directory that someone else
// removed in between is never mistaken for ownership. Closes `fd` on every error.
template <typename StatPath>
StatusOr<int> LockOpenedDir(int fd, const std::string& path, StatPath stat_path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return UnavailableError(path + " is locked by a live process");
    return ErrnoError(err, "flock " + path);
  }
  struct stat a {
  }, b{};
  if (::fstat(fd, &a) != 0 || stat_path(&b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
    ::close(fd);
    return NotFoundError(path + " was removed while being locked");
  }
  return fd;
}

// Opens and locks the directory at `path` (LockOpenedDir).
StatusOr<int> LockDir(const std::string& path) {
  ASSIGN_OR_RETURN(OwnedFd owned, OpenConfined(path, O_RDONLY | O_DIRECTORY, Access::kWrite));
  return LockOpenedDir(owned.release(), path,
                       [&](struct stat* st) { return ::stat(path.c_str(), st); });
}

// mkdir(<dirfd>/.checkpoint-<step>.<what>-XXXXXX) under a fresh random name; returns the name.
StatusOr<std::string> MakeHiddenDirAt(int dirfd, const std::string& output_dir, int64_t step,
                                      const char* what) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  for (int attempt = 0; attempt < 100; ++attempt) {
    char suffix[16];
    std::snprintf(suffix, sizeof(suffix), "%06llx",
                  static_cast<unsigned long long>(rng() & 0xffffff));
    const std::string name = kHiddenPrefix + std::to_string(step) + "." + what + "-" + suffix;
    if (::mkdirat(dirfd, name.c_str(), 0755) == 0) return name;
    if (errno != EEXIST) return ErrnoError(errno, "mkdir " + JoinPath(output_dir, name));
  }
  return AlreadyExistsError(output_dir + ": no free temporary checkpoint directory name");
}

// LockDir for <dirfd>/name, never through a symlink.
StatusOr<int> LockDirAt(int dirfd, const std::string& name, const std::string& path) {
  const int fd = ::openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  return LockOpenedDir(fd, path, [&](struct stat* st) {
    return ::fstatat(dirfd, name.c_str(), st, AT_SYMLINK_NOFOLLOW);
  });
}

// The safetensors file prefix (u64 header length + JSON header padded to 8 bytes) for tensors
// laid out back to back in the given order.

// Checks that `file` holds exactly the F32 tensors `names[i]` with `params[i].shape`.
Status CheckTensors(const engine::SafetensorsFile& file, const std::vector<std::string>& names,
                    const std::vector<ParamSpec>& params, int layer) {
  std::set<std::string_view> expected(names.begin(), names.end());
  for (const engine::TensorInfo& t : file.tensors()) {
    if (!expected.count(t.name)) {
      return FailedPreconditionError(file.path() + ": holds tensor \"" + t.name +
                                     "\", which layer " + std::to_string(layer) +
                                     " of this model does not have");
    }
  }
  for (size_t i = 0; i < names.size(); ++i) {
    const engine::TensorInfo* t = file.Find(names[i]);
    if (t == nullptr)
      return DataLossError(file.path() + ": tensor \"" + names[i] + "\" is missing");
    if (t->dtype != engine::DType::kF32) {
      return DataLossError(file.path() + ": tensor \"" + names[i] + "\" is " +
                           std::string(engine::DTypeName(t->dtype)) + ", expected F32");
    }
    if (t->shape != params[i].shape) {
      return FailedPreconditionError(file.path() + ": tensor \"" + names[i] + "\" has shape " +
                                     ShapeString(t->shape) + ", this model's is " +
                                     ShapeString(params[i].shape));
    }
  }
  return OkStatus();
}

// Lists output_dir's checkpoint-<step> directories, oldest first.
StatusOr<std::vector<std::pair<int64_t, std::string>>> ListCheckpointDirs(
    const std::string& output_dir, std::vector<std::string>* hidden) {
  // Confined like the writer: LatestCheckpoint and PruneCheckpoints delete entries in here.
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(output_dir, O_RDONLY | O_DIRECTORY, Access::kWrite));
  DIR* d = ::fdopendir(fd.get());
  if (d == nullptr) return ErrnoError(errno, "opendir " + output_dir);
  fd.release();  // closedir closes it
  std::vector<std::pair<int64_t, std::string>> out;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string path = JoinPath(output_dir, name);
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    const int64_t step = StepOfDirName(name);
    if (step >= 0) out.emplace_back(step, path);
    if (hidden && name.rfind(kHiddenPrefix, 0) == 0) hidden->push_back(path);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int64_t NumElements(const std::vector<ParamSpec>& params) {
  int64_t n = 0;
  for (const ParamSpec& p : params) {
    int64_t numel = 1;
    for (int64_t d : p.shape) numel *= d;
    n += numel;
  }
  return n;
}

std::string ModelFingerprint(std::string_view architecture,
                             const std::vector<std::vector<ParamSpec>>& layers) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a 64
  auto mix = [&h](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
    h = (h ^ 0xff) * 0x100000001b3ull;  // separator: ("ab","c") != ("a","bc")
  };
  mix(architecture);
  int64_t params = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    mix("layer " + std::to_string(l));
    for (const ParamSpec& p : layers[l]) mix(p.name + " " + ShapeString(p.shape));
    params += NumElements(layers[l]);
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
  return std::string(architecture) + "/" + std::to_string(layers.size()) + " layers/" +
         std::to_string(params) + " params/" + hex;
}

// --- CheckpointWriter ---------------------------------------------------------------------------

StatusOr<CheckpointWriter> CheckpointWriter::Begin(const std::string& output_dir, int64_t step) {
  if (step < 0) return InvalidArgumentError(output_dir + ": negative checkpoint step");
  AsJobUser as_user;  // with the rights of the job's user (common/file_identity.h)
  RETURN_IF_ERROR(as_user.status());
  // Everything below goes through this descriptor: output_dir is resolved once, without symlinks
  // and inside the allowed roots (common/safe_path.h), so replacing it while the job runs cannot
  // redirect the checkpoint elsewhere.
  ASSIGN_OR_RETURN(OwnedFd out, MakeDirsConfined(output_dir));
  CheckpointWriter w;
  w.output_dir_ = output_dir;
  w.step_ = step;
  w.out_fd_ = out.release();
  // A concurrent LatestCheckpoint may take the fresh, not yet locked directory for a dead
  // writer's and remove it; try again with a new name then.
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    ASSIGN_OR_RETURN(std::string name, MakeHiddenDirAt(w.out_fd_, output_dir, step, "tmp"));
    const std::string tmp = JoinPath(output_dir, name);
    StatusOr<int> fd = LockDirAt(w.out_fd_, name, tmp);
    if (fd.ok()) {
      ::fchmod(*fd, 0755);  // against a restrictive umask: others may read the checkpoint
      w.tmp_dir_ = tmp;
      w.tmp_name_ = name;
      w.lock_fd_ = *fd;
      return w;
    }
    last = fd.status();
    ::unlinkat(w.out_fd_, name.c_str(), AT_REMOVEDIR);
  }
  return last;
}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& other) noexcept { *this = std::move(other); }

CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    output_dir_ = std::move(other.output_dir_);
    tmp_dir_ = std::exchange(other.tmp_dir_, {});
    tmp_name_ = std::exchange(other.tmp_name_, {});
    step_ = other.step_;
    out_fd_ = std::exchange(other.out_fd_, -1);
    lock_fd_ = std::exchange(other.lock_fd_, -1);
    layer_params_ = std::move(other.layer_params_);
    files_ = std::move(other.files_);
    crcs_ = std::move(other.crcs_);
    weight_bytes_ = other.weight_bytes_;
  }
  return *this;
}

CheckpointWriter::~CheckpointWriter() { Abandon(); }

void CheckpointWriter::Abandon() {
  if (!tmp_dir_.empty()) {
    AsJobUser as_user;  // removed with the rights it was written with
    // Through the descriptor of output_dir, not its path (which may have been replaced).
    Status st = RemoveTree("/proc/self/fd/" + std::to_string(out_fd_) + "/" + tmp_name_);
    if (!st.ok()) OFFLOADD_LOG(kWarning, "checkpoint") << tmp_dir_ << ": " << st.ToString();
    tmp_dir_.clear();
    tmp_name_.clear();
  }
  if (lock_fd_ >= 0) ::close(std::exchange(lock_fd_, -1));
  if (out_fd_ >= 0) ::close(std::exchange(out_fd_, -1));
}

Status CheckpointWriter::WriteLayer(int layer, const LayerState& state) {
  if (tmp_dir_.empty())
    return FailedPreconditionError(output_dir_ + ": checkpoint writer is spent");
  const std::string what = tmp_dir_ + ": layer " + std::to_string(layer);
  if (layer < 0) return InvalidArgumentError(what + ": negative layer index");
  if (layer_params_.count(layer)) return AlreadyExistsError(what + " was already written");
  std::set<std::string_view> seen;
  for (const ParamSpec& p : state.params) {
    if (p.name.empty() || p.name == "__metadata__" || !seen.insert(p.name).second)
      return InvalidArgumentError(what + ": empty, reserved or repeated name \"" + p.name + "\"");
    for (int64_t d : p.shape) {
      if (d < 0)
        return InvalidArgumentError(what + ": \"" + p.name + "\" has a negative dimension");
    }
  }
  const int64_t n = NumElements(state.params);
  RETURN_IF_ERROR(CheckBufferSize(state.master, n, what + " master"));
  const bool compact = !state.state_dtype.empty();
  if (!compact) {
    RETURN_IF_ERROR(CheckBufferSize(state.exp_avg, n, what + " exp_avg"));
    RETURN_IF_ERROR(CheckBufferSize(state.exp_avg_sq, n, what + " exp_avg_sq"));
  }
  // A bf16 master comes with its region (compact states only), an fp32 one without.
  const bool bf16_master = state.master_dtype == "bf16";
  if ((!bf16_master && state.master_dtype != "fp32") ||
      bf16_master == state.master_region.empty() || (bf16_master && !compact)) {
    return InvalidArgumentError(what + ": master_dtype \"" + state.master_dtype + "\" with " +
                                (state.master_region.empty() ? "no" : "a") + " master region" +
                                (compact ? "" : " and exact states"));
  }

  std::vector<HeaderEntry> weights, moments;
  for (const ParamSpec& p : state.params) {
    weights.push_back({p.name, &p.shape});
    moments.push_back({p.name + ".exp_avg", &p.shape});
  }
  for (const ParamSpec& p : state.params) moments.push_back({p.name + ".exp_avg_sq", &p.shape});
  const std::string l = std::to_string(layer);

  auto write = [&](const std::string& name, const std::string& prefix,
                   std::initializer_list<const ConstPieces*> buffers) -> Status {
    std::vector<std::span<const std::byte>> chunks = {Bytes(prefix)};
    for (const ConstPieces* b : buffers) {
      for (const auto& piece : *b) chunks.push_back(std::as_bytes(piece));
    }
    ASSIGN_OR_RETURN(crcs_[name], WriteSyncedFile(lock_fd_, name, JoinPath(tmp_dir_, name), chunks));
    files_[name] = prefix.size() + static_cast<uint64_t>(n) * sizeof(float) * buffers.size();
    return OkStatus();
  };
  RETURN_IF_ERROR(write(LayerFile("model", layer),
                        SafetensorsPrefix(weights, {{"format", "pt"}, {"layer", l}}),
                        {&state.master}));
  if (compact) {
    RETURN_IF_ERROR(WriteCompactStates(layer, state));
  } else {
    RETURN_IF_ERROR(
        write(LayerFile("optimizer", layer),
              SafetensorsPrefix(
                  moments,
                  {{"format", "pt"}, {"layer", l}, {"adam_step", std::to_string(state.adam_step)}}),
              {&state.exp_avg, &state.exp_avg_sq}));
  }
  weight_bytes_ += static_cast<uint64_t>(n) * sizeof(float);
  std::vector<std::string>& names = layer_params_[layer];
  for (const ParamSpec& p : state.params) names.push_back(p.name);
  return OkStatus();
}

Status CheckpointWriter::AddFile(const std::string& name, std::string_view contents) {
  if (tmp_dir_.empty())
    return FailedPreconditionError(output_dir_ + ": checkpoint writer is spent");
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.' || name == kStateFile ||
      name == kHfStateFile || name == kIndexFile || files_.count(name)) {
    return InvalidArgumentError(tmp_dir_ + ": cannot add a file named \"" + name + "\"");
  }
  ASSIGN_OR_RETURN(crcs_[name],
                   WriteSyncedFile(lock_fd_, name, JoinPath(tmp_dir_, name), {Bytes(contents)}));
  files_[name] = contents.size();
  return OkStatus();
}

StatusOr<CheckpointInfo> CheckpointWriter::Commit(const TrainerState& state) {
  if (tmp_dir_.empty())
    return FailedPreconditionError(output_dir_ + ": checkpoint writer is spent");
  // Spent whatever happens: a failed commit leaves nothing behind.
  struct AbandonOnExit {
    CheckpointWriter* w;
    ~AbandonOnExit() { w->Abandon(); }
  } abandon{this};

  const std::string final_dir = JoinPath(output_dir_, kDirPrefix + std::to_string(step_));
  if (state.global_step != step_) {
    return InvalidArgumentError(final_dir + ": trainer state is at step " +
                                std::to_string(state.global_step) + ", the checkpoint at " +
                                std::to_string(step_));
  }
  const int num_layers = static_cast<int>(layer_params_.size());
  if (num_layers == 0) return FailedPreconditionError(final_dir + ": no layer was written");
  if (layer_params_.rbegin()->first != num_layers - 1) {
    int missing = 0;
    while (layer_params_.count(missing)) ++missing;
    return FailedPreconditionError(final_dir + ": layer " + std::to_string(missing) +
                                   " was not written (highest written: " +
                                   std::to_string(layer_params_.rbegin()->first) + ")");
  }

  json weight_map = json::object();
  for (const auto& [layer, names] : layer_params_) {
    const std::string file = LayerFile("model", layer);
    for (const std::string& name : names) {
      if (weight_map.contains(name)) {
        return InvalidArgumentError(final_dir + ": parameter \"" + name +
                                    "\" appears in two layers");
      }
      weight_map[name] = file;
    }
  }
  const std::string index =
      json{{"metadata", {{"total_size", weight_bytes_}}}, {"weight_map", weight_map}}.dump(2);
  ASSIGN_OR_RETURN(crcs_[kIndexFile], WriteSyncedFile(lock_fd_, kIndexFile,
                                                      JoinPath(tmp_dir_, kIndexFile), {Bytes(index)}));
  files_[kIndexFile] = index.size();
  std::string text;
  try {  // Hugging Face's view of the run, checksummed like every other file
    const std::string hf = HfStateToJson(state).dump(2);
    ASSIGN_OR_RETURN(crcs_[kHfStateFile],
                     WriteSyncedFile(lock_fd_, kHfStateFile, JoinPath(tmp_dir_, kHfStateFile), {Bytes(hf)}));
    files_[kHfStateFile] = hf.size();
  } catch (const json::exception& e) {
    return InvalidArgumentError(final_dir + ": trainer state cannot be written as JSON: " + e.what());
  }
  try {
    json j = StateToJson(state, num_layers, files_);
    json crcs = json::object();
    for (const auto& [name, crc] : crcs_) crcs[name] = Hex(crc);
    j["crc32c"] = std::move(crcs);
    text = j.dump(2);
  } catch (const json::exception& e) {  // strings that are not UTF-8
    return InvalidArgumentError(final_dir +
                                ": trainer state cannot be written as JSON: " + e.what());
  }
  RETURN_IF_ERROR(
      WriteSyncedFile(lock_fd_, kStateFile, JoinPath(tmp_dir_, kStateFile), {Bytes(text)}).status());
  RETURN_IF_ERROR(FsyncFd(lock_fd_, tmp_dir_));

  const std::string final_name = kDirPrefix + std::to_string(step_);
  AsJobUser as_user;  // with the rights of the job's user (common/file_identity.h)
  RETURN_IF_ERROR(as_user.status());
  if (::renameat(out_fd_, tmp_name_.c_str(), out_fd_, final_name.c_str()) != 0) {
    if (errno != ENOTEMPTY && errno != EEXIST)
      return ErrnoError(errno, "rename " + tmp_dir_ + " -> " + final_dir);
    // A checkpoint of this step exists (a resumed job saving the step again): swap atomically,
    // so that one of the two complete checkpoints is at final_dir at every instant; the old one
    // then sits at tmp_dir_ and goes with Abandon().
    if (::renameat2(out_fd_, tmp_name_.c_str(), out_fd_, final_name.c_str(), RENAME_EXCHANGE) != 0)
      return ErrnoError(errno, "replace " + final_dir + " with " + tmp_dir_);
    OFFLOADD_LOG(kInfo, "checkpoint") << "replaced the existing " << final_dir;
  } else {
    tmp_dir_.clear();
  }
  RETURN_IF_ERROR(FsyncFd(out_fd_, output_dir_));

  CheckpointInfo info{final_dir, step_, text.size()};
  for (const auto& [name, bytes] : files_) info.size_bytes += bytes;
  return info;
}

// --- directory management -----------------------------------------------------------------------

namespace {

// Hides output_dir/checkpoint-<step> first (one rename) so that a crash mid-removal leaves no
// half-deleted checkpoint, locked from before the rename so that LatestCheckpoint leaves the
// removal to us; through the confined directory, never a path a symlink could redirect.
Status RemoveCheckpointDir(const std::string& output_dir, int64_t step, const std::string& path) {
  ASSIGN_OR_RETURN(OwnedFd out, OpenConfined(output_dir, O_RDONLY | O_DIRECTORY, Access::kWrite));
  ASSIGN_OR_RETURN(int fd, LockDir(path));
  StatusOr<std::string> hidden = MakeHiddenDirAt(out.get(), output_dir, step, "deleting");
  Status st = hidden.status();
  const std::string name = path.substr(path.rfind('/') + 1);
  if (st.ok() && ::renameat(out.get(), name.c_str(), out.get(), hidden->c_str()) != 0)
    st = ErrnoError(errno, "rename " + path + " -> " + JoinPath(output_dir, *hidden));
  if (st.ok()) st = RemoveTree("/proc/self/fd/" + std::to_string(out.get()) + "/" + *hidden);
  ::close(fd);
  return st;
}

}  // namespace

Status PruneCheckpoints(const std::string& output_dir, int64_t keep) {
  if (keep <= 0) return OkStatus();
  AsJobUser as_user;  // with the rights of the job's user (common/file_identity.h)
  RETURN_IF_ERROR(as_user.status());
  ASSIGN_OR_RETURN(auto dirs, ListCheckpointDirs(output_dir, nullptr));
  std::vector<std::pair<int64_t, std::string>> valid;
  for (auto& d : dirs) {
    if (CheckpointReader::Open(d.second).ok()) valid.push_back(std::move(d));
  }
  for (size_t i = 0; i + static_cast<uint64_t>(keep) < valid.size(); ++i) {
    const auto& [step, path] = valid[i];
    RETURN_IF_ERROR(RemoveCheckpointDir(output_dir, step, path));
    OFFLOADD_LOG(kInfo, "checkpoint") << "deleted " << path << " (save_total_limit " << keep << ")";
  }
  return OkStatus();
}

Status RemoveCheckpoints(const std::string& output_dir) {
  AsJobUser as_user;
  RETURN_IF_ERROR(as_user.status());
  ASSIGN_OR_RETURN(auto dirs, ListCheckpointDirs(output_dir, nullptr));
  for (const auto& [step, path] : dirs) {
    RETURN_IF_ERROR(RemoveCheckpointDir(output_dir, step, path));
    OFFLOADD_LOG(kInfo, "checkpoint") << "deleted " << path << " (overwrite_output_dir)";
  }
  return OkStatus();
}

StatusOr<std::string> LatestCheckpoint(const std::string& output_dir) { return LatestCheckpoint(output_dir, nullptr); }

StatusOr<std::string> LatestCheckpoint(const std::string& output_dir, std::vector<std::string>* skipped) {
  if (!PathExists(output_dir)) {
    return NotFoundError(output_dir + ": no checkpoint (the directory does not exist)");
  }
  AsJobUser as_user;  // with the rights of the job's user (common/file_identity.h)
  RETURN_IF_ERROR(as_user.status());
  // An export killed before its rename left a whole model's worth of temporary file
  // (export_files.h).
  if (auto removed = RemoveExportTemporaries(output_dir); !removed.ok()) {
    OFFLOADD_LOG(kWarning, "checkpoint") << removed.status().ToString();
  }
  std::vector<std::string> hidden;
  ASSIGN_OR_RETURN(auto dirs, ListCheckpointDirs(output_dir, &hidden));
  for (const std::string& path : hidden) {
    StatusOr<int> fd = LockDir(path);
    if (!fd.ok()) continue;  // a live writer or pruner, or already gone
    Status st = RemoveTree(path);
    ::close(*fd);
    if (st.ok()) {
      OFFLOADD_LOG(kInfo, "checkpoint") << "removed " << path << ", left by an interrupted save";
    } else {
      OFFLOADD_LOG(kWarning, "checkpoint") << st.ToString();
    }
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    StatusOr<CheckpointReader> r = CheckpointReader::Open(it->second);
    const Status st = r.ok() ? r->Verify() : r.status();
    if (st.ok()) return it->second;
    OFFLOADD_LOG(kWarning, "checkpoint") << "skipping " << it->second << ": " << st.ToString();
    if (skipped != nullptr) skipped->push_back("skipped " + it->second + ": " + st.ToString());
  }
  return NotFoundError(output_dir + ": no complete checkpoint-<step> directory");
}

// --- CheckpointReader ---------------------------------------------------------------------------

StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& dir,
                                                  std::string_view expected_fingerprint,
                                                  std::string_view state_dtype,
                                                  std::string_view master_dtype) {
  std::string path = JoinPath(dir, kStateFile);
  StatusOr<std::string> text = ReadFileConfined(path);
  if (!text.ok() && text.status().code() == StatusCode::kNotFound) {
    // Earlier builds kept offloadd's state in trainer_state.json; a Hugging Face Trainer's
    // checkpoint has one too, with its own schema.
    const std::string hf_path = JoinPath(dir, kHfStateFile);
    StatusOr<std::string> hf = ReadFileConfined(hf_path);
    if (!hf.ok()) {
      if (hf.status().code() == StatusCode::kNotFound)
        return NotFoundError(path + " is missing: not a (complete) checkpoint");
      return hf.status();
    }
    const json hj = json::parse(*hf, nullptr, /*allow_exceptions=*/false);
    if (!hj.is_object() || !hj.contains("format")) {
      return FailedPreconditionError(
          dir + " is a Hugging Face Trainer checkpoint (trainer_state.json without offloadd's " + kStateFile +
          "): offloadd resumes only checkpoints it wrote. To fine-tune from its weights, give the directory "
          "as model.path and leave resume_from_checkpoint unset");
    }
    path = hf_path;
    text = std::move(hf);
  }
  if (!text.ok()) return text.status();
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(path + ": not a JSON object (" + std::to_string(text->size()) + " bytes)");
  }
  CheckpointReader r;
  r.dir_ = dir;
  std::map<std::string, uint64_t>& files = r.files_;
  RETURN_IF_ERROR(StateFromJson(j, path, &r.state_, &r.num_layers_, &files));
  RETURN_IF_ERROR(ChecksumsFromJson(j, path, files, &r.crcs_));
  for (int layer = 0; layer < r.num_layers_; ++layer) {
    for (const char* kind : {"model", "optimizer"}) {
      if (!files.count(LayerFile(kind, layer)))
        return DataLossError(path + ": \"files\" does not list " + LayerFile(kind, layer));
    }
  }
  for (const auto& [name, bytes] : files) {
    const std::string file = JoinPath(dir, name);
    struct stat st {};
    if (::stat(file.c_str(), &st) != 0) {
      if (errno == ENOENT)
        return DataLossError(file + " is missing (listed in " + path + ")");
      return ErrnoError(errno, "stat " + file);
    }
    if (static_cast<uint64_t>(st.st_size) != bytes) {
      return DataLossError(file + " is " + std::to_string(st.st_size) + " bytes, " + path +
                           " recorded " + std::to_string(bytes) + " (truncated or overwritten)");
    }
  }
  if (!expected_fingerprint.empty() && r.state_.model_fingerprint != expected_fingerprint) {
    return FailedPreconditionError(path + ": the checkpoint is of model \"" +
                                   r.state_.model_fingerprint + "\", this job's model is \"" +
                                   std::string(expected_fingerprint) + "\"");
  }
  if (r.state_.state_dtype != state_dtype || r.state_.master_dtype != master_dtype) {
    const auto mode = [](std::string_view master, std::string_view state) {
      const std::string what = std::string(master) + " master, " + std::string(state) + " states";
      return master == "fp32" && state == "fp32" ? "exact (" + what + ")" : "not exact: " + what;
    };
    return FailedPreconditionError(
        path + ": the checkpoint's optimizer states are " +
        mode(r.state_.master_dtype, r.state_.state_dtype) + ", this run's are " +
        mode(master_dtype, state_dtype) +
        "; resuming in another optimizer mode is not supported (set optimizer.state_dtype and "
        "master_dtype as the checkpoint was trained)");
  }
  return r;
}

StatusOr<int64_t> CheckpointReader::ReadLayer(int layer, const LayerTarget& target) const {
  if (layer < 0 || layer >= num_layers_) {
    return OutOfRangeError(dir_ + ": layer " + std::to_string(layer) +
                           " requested, the checkpoint has " + std::to_string(num_layers_));
  }
  const int64_t n = NumElements(target.params);
  const std::string what = dir_ + ": layer " + std::to_string(layer);
  RETURN_IF_ERROR(CheckBufferSize(target.master, n, what + " master"));
  if (!target.exp_avg.empty())
    RETURN_IF_ERROR(CheckBufferSize(target.exp_avg, n, what + " exp_avg"));
  if (!target.exp_avg_sq.empty())
    RETURN_IF_ERROR(CheckBufferSize(target.exp_avg_sq, n, what + " exp_avg_sq"));

  // Tensors are looked up by name and copied to their place in the flat buffer, so a file that
  // some other tool rewrote in another order still loads.
  auto load = [&](const engine::SafetensorsFile& file, const std::string& suffix,
                  const Pieces& dst) {
    uint64_t offset = 0;
    for (const ParamSpec& p : target.params) {
      const engine::TensorInfo* t = file.Find(p.name + suffix);
      Scatter(dst, offset, file.data(*t));
      offset += static_cast<uint64_t>(t->numel());
    }
  };
  std::vector<std::string> names;
  for (const ParamSpec& p : target.params) names.push_back(p.name);
  {
    RETURN_IF_ERROR(VerifyFile(LayerFile("model", layer)));
    ASSIGN_OR_RETURN(auto file,
                     engine::SafetensorsFile::Open(JoinPath(dir_, LayerFile("model", layer))));
    RETURN_IF_ERROR(CheckTensors(*file, names, target.params, layer));
    load(*file, "", target.master);
  }
  if (!target.state_dtype.empty()) return ReadCompactStates(layer, target);
  if (target.exp_avg.empty() && target.exp_avg_sq.empty()) return int64_t{0};

  RETURN_IF_ERROR(VerifyFile(LayerFile("optimizer", layer)));
  ASSIGN_OR_RETURN(auto file,
                   engine::SafetensorsFile::Open(JoinPath(dir_, LayerFile("optimizer", layer))));
  std::vector<std::string> moment_names;
  std::vector<ParamSpec> moment_params;
  for (const char* suffix : {".exp_avg", ".exp_avg_sq"}) {
    for (const ParamSpec& p : target.params) {
      moment_names.push_back(p.name + suffix);
      moment_params.push_back(p);
    }
  }
  RETURN_IF_ERROR(CheckTensors(*file, moment_names, moment_params, layer));
  auto it = file->metadata().find("adam_step");
  const std::string text = it == file->metadata().end() ? "" : it->second;
  char* end = nullptr;
  const long long adam_step = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || adam_step < 0 || *end != '\0') {
    return DataLossError(file->path() + ": metadata \"adam_step\" is missing or not a count");
  }
  if (!target.exp_avg.empty()) load(*file, ".exp_avg", target.exp_avg);
  if (!target.exp_avg_sq.empty()) load(*file, ".exp_avg_sq", target.exp_avg_sq);
  return static_cast<int64_t>(adam_step);
}

Status CheckpointReader::VerifyFile(const std::string& name) const {
  auto want = crcs_.find(name);
  if (want == crcs_.end()) return OkStatus();  // an older checkpoint: nothing to check against
  const std::string path = JoinPath(dir_, name);
  ASSIGN_OR_RETURN(OwnedFd fd, OpenConfined(path, O_RDONLY, Access::kRead));
  std::vector<char> buf(kVerifyChunk);
  uint32_t crc = 0;
  uint64_t size = 0;
  while (true) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read " + path);
    }
    if (n == 0) break;
    crc = Crc32c(crc, buf.data(), static_cast<size_t>(n));
    size += static_cast<uint64_t>(n);
  }
  if (crc != want->second) {
    return DataLossError(path + ": checksum mismatch (crc32c " + Hex(crc) + " over " +
                         std::to_string(size) + " bytes, " + kStateFile + " recorded " +
                         Hex(want->second) + "): the file is corrupt and is not used");
  }
  return OkStatus();
}

Status CheckpointReader::Verify() const {
  if (crcs_.empty()) {
    OFFLOADD_LOG(kWarning, "checkpoint")
        << dir_ << " was written without checksums (an older offloadd): its data is not verified";
    return OkStatus();
  }
  for (const auto& [name, crc] : crcs_) RETURN_IF_ERROR(VerifyFile(name));
  return OkStatus();
}

}  // namespace offloadd::trainer
