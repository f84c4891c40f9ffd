#include "trainer/checkpoint.h"

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
#include <set>
#include <utility>

#include "common/logging.h"
#include "engine/file_util.h"
#include "engine/safetensors.h"

namespace offloadd::trainer {
namespace {

using engine::JoinPath;
using json = nlohmann::json;

// Layer files hold the host's floats as they are; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little,
              "checkpoints assume a little-endian host");

constexpr char kStateFile[] = "trainer_state.json";
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kFormat[] = "offloadd-checkpoint";
constexpr int kVersion = 1;
constexpr char kDirPrefix[] = "checkpoint-";
constexpr char kHiddenPrefix[] = ".checkpoint-";  // writers' and pruners' temporary directories

std::string LayerFile(const char* kind, int layer) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s-layer-%05d.safetensors", kind, layer);
  return buf;
}

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

Status WriteAll(int fd, const std::byte* data, size_t size, const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write " + path);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return OkStatus();
}

// Creates `path` (which must not exist), writes the chunks, fsyncs. Removes it on failure.
Status WriteSyncedFile(const std::string& path,
                       const std::vector<std::span<const std::byte>>& chunks) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "create " + path);
  Status st;
  for (const auto& c : chunks) {
    st = WriteAll(fd, c.data(), c.size(), path);
    if (!st.ok()) break;
  }
  if (st.ok() && ::fsync(fd) != 0) st = ErrnoError(errno, "fsync " + path);
  if (::close(fd) != 0 && st.ok()) st = ErrnoError(errno, "close " + path);
  if (!st.ok()) ::unlink(path.c_str());
  return st;
}

Status FsyncDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  Status st = ::fsync(fd) == 0 ? OkStatus() : ErrnoError(errno, "fsync " + path);
  ::close(fd);
  return st;
}

// Opens and flocks (non-blocking) a directory; checks it is still at `path` once locked, so a lock
// on a directory that someone else removed in between is never mistaken for ownership.
StatusOr<int> LockDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open " + path);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    if (err == EWOULDBLOCK) return UnavailableError(path + " is locked by a live process");
    return ErrnoError(err, "flock " + path);
  }
  struct stat a {
  }, b{};
  if (::fstat(fd, &a) != 0 || ::stat(path.c_str(), &b) != 0 || a.st_ino != b.st_ino ||
      a.st_dev != b.st_dev) {
    ::close(fd);
    return NotFoundError(path + " was removed while being locked");
  }
  return fd;
}

// mkdtemp(output_dir/.checkpoint-<step>.<what>-XXXXXX).
StatusOr<std::string> MakeHiddenDir(const std::string& output_dir, int64_t step, const char* what) {
  std::string templ =
      JoinPath(output_dir, kHiddenPrefix + std::to_string(step) + "." + what + "-XXXXXX");
  if (::mkdtemp(templ.data()) == nullptr) return ErrnoError(errno, "mkdtemp " + templ);
  return templ;
}

// The safetensors file prefix (u64 header length + JSON header padded to 8 bytes) for tensors
// laid out back to back in the given order.
struct HeaderEntry {
  std::string name;
  const std::vector<int64_t>* shape;
};
std::string SafetensorsPrefix(const std::vector<HeaderEntry>& entries,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const HeaderEntry& e : entries) {
    uint64_t numel = 1;
    for (int64_t d : *e.shape) numel *= static_cast<uint64_t>(d);
    const uint64_t bytes = numel * sizeof(float);
    header[e.name] = {
        {"dtype", "F32"}, {"shape", *e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return out + text;
}

std::span<const std::byte> Bytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// --- trainer_state.json -------------------------------------------------------------------------

// JSON has no NaN or infinities; write them as Python's json module does, as strings.
json DoubleToJson(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return v;
}

// Typed access to a JSON object's keys with errors that name the file and the key.
class JsonFields {
 public:
  JsonFields(const json& obj, std::string origin) : obj_(obj), origin_(std::move(origin)) {}

  bool Has(const char* key) const { return obj_.find(key) != obj_.end(); }
  StatusOr<const json*> Get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return Bad(key, "is missing");
    return &*it;
  }
  StatusOr<int64_t> Int(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_number_integer() ||
        (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}))
      return Bad(key, "must be an integer");
    return v->get<int64_t>();
  }
  StatusOr<uint64_t> Uint(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_number_unsigned()) return Bad(key, "must be a non-negative integer");
    return v->get<uint64_t>();
  }
  StatusOr<double> Double(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (v->is_number()) return v->get<double>();
    if (*v == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (*v == "Infinity") return std::numeric_limits<double>::infinity();
    if (*v == "-Infinity") return -std::numeric_limits<double>::infinity();
    return Bad(key, "must be a number");
  }
  StatusOr<std::string> String(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_string()) return Bad(key, "must be a string");
    return v->get<std::string>();
  }
  StatusOr<JsonFields> Object(const char* key) const {
    ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_object()) return Bad(key, "must be an object");
    return JsonFields(*v, origin_ + ": \"" + key + "\"");
  }
  Status Bad(const char* key, const std::string& what) const {
    return DataLossError(origin_ + ": key \"" + key + "\" " + what);
  }
  const std::string& origin() const { return origin_; }

 private:
  const json& obj_;
  std::string origin_;
};

json StateToJson(const TrainerState& s, int num_layers,
                 const std::map<std::string, uint64_t>& files) {
  json log = json::array();
  for (const LogEntry& e : s.log_history) {
    log.push_back({{"step", e.step},
                   {"epoch", DoubleToJson(e.epoch)},
                   {"loss", DoubleToJson(e.loss)},
                   {"learning_rate", DoubleToJson(e.learning_rate)},
                   {"grad_norm", DoubleToJson(e.grad_norm)}});
  }
  json out = {{"format", kFormat},
              {"version", kVersion},
              {"global_step", s.global_step},
              {"max_steps", s.max_steps},
              {"epoch", DoubleToJson(s.epoch)},
              {"num_input_tokens_seen", s.num_input_tokens_seen},
              {"seed", s.seed},
              {"rng_state", s.rng_state},
              {"data_cursor", s.data_cursor},
              {"lr_scheduler",
               {{"lr_scheduler_type", s.scheduler.lr_scheduler_type},
                {"learning_rate", DoubleToJson(s.scheduler.learning_rate)},
                {"warmup_steps", s.scheduler.warmup_steps},
                {"total_steps", s.scheduler.total_steps}}},
              {"model_fingerprint", s.model_fingerprint},
              {"log_history", std::move(log)},
              {"num_layers", num_layers},
              {"files", files}};
  if (s.grad_scaler) {
    out["grad_scaler"] = {{"scale", DoubleToJson(s.grad_scaler->scale)},
                          {"growth_tracker", s.grad_scaler->growth_tracker}};
  }
  return out;
}

Status StateFromJson(const JsonFields& f, TrainerState* s, int* num_layers,
                     std::map<std::string, uint64_t>* files) {
  ASSIGN_OR_RETURN(std::string format, f.String("format"));
  ASSIGN_OR_RETURN(int64_t version, f.Int("version"));
  if (format != kFormat || version != kVersion) {
    return FailedPreconditionError(f.origin() + ": format \"" + format + "\" version " +
                                   std::to_string(version) + ", this build reads \"" + kFormat +
                                   "\" version " + std::to_string(kVersion));
  }
  ASSIGN_OR_RETURN(s->global_step, f.Int("global_step"));
  ASSIGN_OR_RETURN(s->max_steps, f.Int("max_steps"));
  ASSIGN_OR_RETURN(s->epoch, f.Double("epoch"));
  ASSIGN_OR_RETURN(s->num_input_tokens_seen, f.Int("num_input_tokens_seen"));
  ASSIGN_OR_RETURN(s->seed, f.Uint("seed"));
  ASSIGN_OR_RETURN(s->rng_state, f.String("rng_state"));
  ASSIGN_OR_RETURN(s->data_cursor, f.String("data_cursor"));
  ASSIGN_OR_RETURN(JsonFields sched, f.Object("lr_scheduler"));
  ASSIGN_OR_RETURN(s->scheduler.lr_scheduler_type, sched.String("lr_scheduler_type"));
  ASSIGN_OR_RETURN(s->scheduler.learning_rate, sched.Double("learning_rate"));
  ASSIGN_OR_RETURN(s->scheduler.warmup_steps, sched.Int("warmup_steps"));
  ASSIGN_OR_RETURN(s->scheduler.total_steps, sched.Int("total_steps"));
  ASSIGN_OR_RETURN(s->model_fingerprint, f.String("model_fingerprint"));
  ASSIGN_OR_RETURN(const json* log, f.Get("log_history"));
  if (!log->is_array()) return f.Bad("log_history", "must be an array");
  for (size_t i = 0; i < log->size(); ++i) {
    const json& e = (*log)[i];
    const std::string origin = f.origin() + ": log_history[" + std::to_string(i) + "]";
    if (!e.is_object()) return DataLossError(origin + " must be an object");
    JsonFields ef(e, origin);
    LogEntry entry;
    ASSIGN_OR_RETURN(entry.step, ef.Int("step"));
    ASSIGN_OR_RETURN(entry.epoch, ef.Double("epoch"));
    ASSIGN_OR_RETURN(entry.loss, ef.Double("loss"));
    ASSIGN_OR_RETURN(entry.learning_rate, ef.Double("learning_rate"));
    ASSIGN_OR_RETURN(entry.grad_norm, ef.Double("grad_norm"));
    s->log_history.push_back(entry);
  }
  if (f.Has("grad_scaler")) {
    ASSIGN_OR_RETURN(JsonFields gs, f.Object("grad_scaler"));
    GradScalerState st;
    ASSIGN_OR_RETURN(double scale, gs.Double("scale"));
    st.scale = static_cast<float>(scale);
    ASSIGN_OR_RETURN(st.growth_tracker, gs.Int("growth_tracker"));
    s->grad_scaler = st;
  }
  ASSIGN_OR_RETURN(int64_t layers, f.Int("num_layers"));
  if (layers < 1 || layers > 1'000'000) return f.Bad("num_layers", "is out of range");
  *num_layers = static_cast<int>(layers);
  ASSIGN_OR_RETURN(JsonFields files_obj, f.Object("files"));
  ASSIGN_OR_RETURN(const json* fj, f.Get("files"));
  for (auto it = fj->begin(); it != fj->end(); ++it) {
    const std::string& name = it.key();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      return f.Bad("files", "names a file outside the checkpoint: \"" + name + "\"");
    ASSIGN_OR_RETURN((*files)[name], files_obj.Uint(name.c_str()));
  }
  return OkStatus();
}

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
  DIR* d = ::opendir(output_dir.c_str());
  if (d == nullptr) return ErrnoError(errno, "opendir " + output_dir);
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
  RETURN_IF_ERROR(engine::MakeDirs(output_dir));
  CheckpointWriter w;
  w.output_dir_ = output_dir;
  w.step_ = step;
  // A concurrent LatestCheckpoint may take the fresh, not yet locked directory for a dead
  // writer's and remove it; try again with a new name then.
  Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    ASSIGN_OR_RETURN(std::string tmp, MakeHiddenDir(output_dir, step, "tmp"));
    StatusOr<int> fd = LockDir(tmp);
    if (fd.ok()) {
      ::fchmod(*fd, 0755);  // mkdtemp's 0700 would hide the checkpoint from other users
      w.tmp_dir_ = std::move(tmp);
      w.lock_fd_ = *fd;
      return w;
    }
    last = fd.status();
    ::rmdir(tmp.c_str());
  }
  return last;
}

CheckpointWriter::CheckpointWriter(CheckpointWriter&& other) noexcept { *this = std::move(other); }

CheckpointWriter& CheckpointWriter::operator=(CheckpointWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    output_dir_ = std::move(other.output_dir_);
    tmp_dir_ = std::exchange(other.tmp_dir_, {});
    step_ = other.step_;
    lock_fd_ = std::exchange(other.lock_fd_, -1);
    layer_params_ = std::move(other.layer_params_);
    files_ = std::move(other.files_);
    weight_bytes_ = other.weight_bytes_;
  }
  return *this;
}

CheckpointWriter::~CheckpointWriter() { Abandon(); }

void CheckpointWriter::Abandon() {
  if (!tmp_dir_.empty()) {
    Status st = engine::RemoveTree(tmp_dir_);
    if (!st.ok()) OFFLOADD_LOG(kWarning, "checkpoint") << st.ToString();
    tmp_dir_.clear();
  }
  if (lock_fd_ >= 0) ::close(std::exchange(lock_fd_, -1));
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
  RETURN_IF_ERROR(CheckBufferSize(state.exp_avg, n, what + " exp_avg"));
  RETURN_IF_ERROR(CheckBufferSize(state.exp_avg_sq, n, what + " exp_avg_sq"));

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
    RETURN_IF_ERROR(WriteSyncedFile(JoinPath(tmp_dir_, name), chunks));
    files_[name] = prefix.size() + static_cast<uint64_t>(n) * sizeof(float) * buffers.size();
    return OkStatus();
  };
  RETURN_IF_ERROR(write(LayerFile("model", layer),
                        SafetensorsPrefix(weights, {{"format", "pt"}, {"layer", l}}),
                        {&state.master}));
  RETURN_IF_ERROR(
      write(LayerFile("optimizer", layer),
            SafetensorsPrefix(
                moments,
                {{"format", "pt"}, {"layer", l}, {"adam_step", std::to_string(state.adam_step)}}),
            {&state.exp_avg, &state.exp_avg_sq}));
  weight_bytes_ += static_cast<uint64_t>(n) * sizeof(float);
  std::vector<std::string>& names = layer_params_[layer];
  for (const ParamSpec& p : state.params) names.push_back(p.name);
  return OkStatus();
}

Status CheckpointWriter::AddFile(const std::string& name, std::string_view contents) {
  if (tmp_dir_.empty())
    return FailedPreconditionError(output_dir_ + ": checkpoint writer is spent");
  if (name.empty() || name.find('/') != std::string::npos || name[0] == '.' || name == kStateFile ||
      name == kIndexFile || files_.count(name)) {
    return InvalidArgumentError(tmp_dir_ + ": cannot add a file named \"" + name + "\"");
  }
  RETURN_IF_ERROR(WriteSyncedFile(JoinPath(tmp_dir_, name), {Bytes(contents)}));
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
  RETURN_IF_ERROR(WriteSyncedFile(JoinPath(tmp_dir_, kIndexFile), {Bytes(index)}));
  files_[kIndexFile] = index.size();
  std::string text;
  try {
    text = StateToJson(state, num_layers, files_).dump(2);
  } catch (const json::exception& e) {  // strings that are not UTF-8
    return InvalidArgumentError(final_dir +
                                ": trainer state cannot be written as JSON: " + e.what());
  }
  RETURN_IF_ERROR(WriteSyncedFile(JoinPath(tmp_dir_, kStateFile), {Bytes(text)}));
  RETURN_IF_ERROR(FsyncDir(tmp_dir_));

  if (::rename(tmp_dir_.c_str(), final_dir.c_str()) != 0) {
    if (errno != ENOTEMPTY && errno != EEXIST)
      return ErrnoError(errno, "rename " + tmp_dir_ + " -> " + final_dir);
    // A checkpoint of this step exists (a resumed job saving the step again): swap atomically,
    // so that one of the two complete checkpoints is at final_dir at every instant; the old one
    // then sits at tmp_dir_ and goes with Abandon().
    if (::renameat2(AT_FDCWD, tmp_dir_.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      return ErrnoError(errno, "replace " + final_dir + " with " + tmp_dir_);
    OFFLOADD_LOG(kInfo, "checkpoint") << "replaced the existing " << final_dir;
  } else {
    tmp_dir_.clear();
  }
  RETURN_IF_ERROR(FsyncDir(output_dir_));

  CheckpointInfo info{final_dir, step_, text.size()};
  for (const auto& [name, bytes] : files_) info.size_bytes += bytes;
  return info;
}

// --- directory management -----------------------------------------------------------------------

Status PruneCheckpoints(const std::string& output_dir, int64_t keep) {
  if (keep <= 0) return OkStatus();
  ASSIGN_OR_RETURN(auto dirs, ListCheckpointDirs(output_dir, nullptr));
  std::vector<std::pair<int64_t, std::string>> valid;
  for (auto& d : dirs) {
    if (CheckpointReader::Open(d.second).ok()) valid.push_back(std::move(d));
  }
  for (size_t i = 0; i + static_cast<uint64_t>(keep) < valid.size(); ++i) {
    const auto& [step, path] = valid[i];
    // Hide it first (one rename) so that a crash mid-removal leaves no half-deleted checkpoint;
    // locked from before the rename so that LatestCheckpoint leaves the removal to us.
    ASSIGN_OR_RETURN(int fd, LockDir(path));
    StatusOr<std::string> hidden = MakeHiddenDir(output_dir, step, "deleting");
    Status st = hidden.status();
    if (st.ok() && ::rename(path.c_str(), hidden->c_str()) != 0)
      st = ErrnoError(errno, "rename " + path + " -> " + *hidden);
    if (st.ok()) st = engine::RemoveTree(*hidden);
    ::close(fd);
    RETURN_IF_ERROR(st);
    OFFLOADD_LOG(kInfo, "checkpoint") << "deleted " << path << " (save_total_limit " << keep << ")";
  }
  return OkStatus();
}

StatusOr<std::string> LatestCheckpoint(const std::string& output_dir) {
  if (!engine::PathExists(output_dir)) {
    return NotFoundError(output_dir + ": no checkpoint (the directory does not exist)");
  }
  std::vector<std::string> hidden;
  ASSIGN_OR_RETURN(auto dirs, ListCheckpointDirs(output_dir, &hidden));
  for (const std::string& path : hidden) {
    StatusOr<int> fd = LockDir(path);
    if (!fd.ok()) continue;  // a live writer or pruner, or already gone
    Status st = engine::RemoveTree(path);
    ::close(*fd);
    if (st.ok()) {
      OFFLOADD_LOG(kInfo, "checkpoint") << "removed " << path << ", left by an interrupted save";
    } else {
      OFFLOADD_LOG(kWarning, "checkpoint") << st.ToString();
    }
  }
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    StatusOr<CheckpointReader> r = CheckpointReader::Open(it->second);
    if (r.ok()) return it->second;
    OFFLOADD_LOG(kWarning, "checkpoint")
        << "skipping " << it->second << ": " << r.status().ToString();
  }
  return NotFoundError(output_dir + ": no complete checkpoint-<step> directory");
}

// --- CheckpointReader ---------------------------------------------------------------------------

StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& dir,
                                                  std::string_view expected_fingerprint) {
  const std::string path = JoinPath(dir, kStateFile);
  StatusOr<std::string> text = engine::ReadFile(path);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound)
      return NotFoundError(path + " is missing: not a (complete) checkpoint");
    return text.status();
  }
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return DataLossError(path + ": not a JSON object (" + std::to_string(text->size()) + " bytes)");
  }
  CheckpointReader r;
  r.dir_ = dir;
  std::map<std::string, uint64_t> files;
  RETURN_IF_ERROR(StateFromJson(JsonFields(j, path), &r.state_, &r.num_layers_, &files));
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
        return DataLossError(file + " is missing (listed in " + kStateFile + ")");
      return ErrnoError(errno, "stat " + file);
    }
    if (static_cast<uint64_t>(st.st_size) != bytes) {
      return DataLossError(file + " is " + std::to_string(st.st_size) + " bytes, " + kStateFile +
                           " recorded " + std::to_string(bytes) + " (truncated or overwritten)");
    }
  }
  if (!expected_fingerprint.empty() && r.state_.model_fingerprint != expected_fingerprint) {
    return FailedPreconditionError(path + ": the checkpoint is of model \"" +
                                   r.state_.model_fingerprint + "\", this job's model is \"" +
                                   std::string(expected_fingerprint) + "\"");
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
    ASSIGN_OR_RETURN(auto file,
                     engine::SafetensorsFile::Open(JoinPath(dir_, LayerFile("model", layer))));
    RETURN_IF_ERROR(CheckTensors(*file, names, target.params, layer));
    load(*file, "", target.master);
  }
  if (target.exp_avg.empty() && target.exp_avg_sq.empty()) return int64_t{0};

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

}  // namespace offloadd::trainer
