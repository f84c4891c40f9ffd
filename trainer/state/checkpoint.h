#pragma once
// Training checkpoints, torch-free: fp32 master weights, AdamW state and the trainer's
// bookkeeping, written so that a crash at any point (kill -9 included) never damages an existing
// checkpoint and never leaves an incomplete one that LatestCheckpoint would pick.
//
// Layout of output_dir/checkpoint-<step>/ (the name the Hugging Face Trainer uses):
//   model-layer-00003.safetensors      fp32 master weights of layer 3 under their Hugging Face
//                                      names; with model.safetensors.index.json the directory
//                                      loads as fp32 weights (engine::Checkpoint, safetensors)
//   optimizer-layer-00003.safetensors  "<name>.exp_avg" and "<name>.exp_avg_sq"; metadata
//                                      "adam_step" = AdamW updates applied to the layer. Compact
//                                      states (docs/optimizer-modes.md) in their own format: U8
//                                      tensors "exp_avg" and "exp_avg_sq", each the layer's state
//                                      region as the workers hold it (bf16 values, or int8 codes
//                                      followed by the fp32 block scales), metadata "state_dtype"
//                                      and "master_dtype"; a bf16 master adds U8 "master", its
//                                      region (the bf16 master, then its bf16 compensation), and
//                                      the model file holds master + compensation in fp32
//   model.safetensors.index.json       {"metadata": {"total_size"}, "weight_map": {name: file}}
//   trainer_state.json                 Hugging Face's TrainerState schema with this run's values
//                                      (transformers' TrainerState.load_from_json reads it)
//   offloadd_state.json                TrainerState, plus the byte size and the crc32c of every
//                                      file above ("files", "crc32c"); written last: the commit
// Checkpoints of earlier builds kept offloadd's state in trainer_state.json; they still load.
// Layers are the pipeline's blocks: 0 = embedding, 1..N = decoder layers, N + 1 = head. Inside a
// layer file the tensors lie back to back in the layer's parameter order, so its data section is
// the pipeline's flat buffer byte for byte; readers still look tensors up by name.
//
// Atomicity: a writer fills output_dir/.checkpoint-<step>.tmp-XXXXXX (flock'ed while alive),
// fsyncs every file and the directory, renames it to checkpoint-<step> and fsyncs output_dir.
// Only directories named checkpoint-<digits> whose offloadd_state.json parses and lists files of
// the recorded sizes count as checkpoints; LatestCheckpoint also checks every file's crc32c, so
// that flipped bytes in tensor data send a resume to the previous intact checkpoint, and ReadLayer
// checks the crc32c of the files it reads. Checkpoints written before checksums existed (no
// "crc32c" key) still load, with a warning.
//
// Paths: output_dir is opened through common/safe_path.h (inside the allowed roots, never through a
// symlink) and the writer works relative to that descriptor; files are created O_EXCL|O_NOFOLLOW.
//
//   ASSIGN_OR_RETURN(CheckpointWriter w, CheckpointWriter::Begin(output_dir, step));
//   for (int layer = 0; layer < num_layers; ++layer) RETURN_IF_ERROR(w.WriteLayer(layer, ...));
//   ASSIGN_OR_RETURN(CheckpointInfo info, w.Commit(trainer_state));
//   RETURN_IF_ERROR(PruneCheckpoints(output_dir, save_total_limit));
//   ...
//   ASSIGN_OR_RETURN(std::string dir, LatestCheckpoint(output_dir));  // after a crash
//   ASSIGN_OR_RETURN(CheckpointReader r, CheckpointReader::Open(dir, ModelFingerprint(...)));
//   ASSIGN_OR_RETURN(int64_t adam_step, r.ReadLayer(layer, {params, {master}, {m}, {v}}));
//
// Every error message starts with the file (or directory) it is about. POSIX calls only, no
// std::filesystem (this links into LibTorch binaries; see docs/DEVELOPING.md).

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "job/grad_scaler.h"

namespace offloadd::trainer {

// One parameter of a layer: Hugging Face name and shape. A layer's flat buffers hold its
// parameters back to back in the order of its ParamSpec list.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};
int64_t NumElements(const std::vector<ParamSpec>& params);

// "<architecture>/<layers> layers/<params> params/<16 hex digits>": a hash of every layer's
// parameter names and shapes, readable enough to say which model a checkpoint belongs to.
std::string ModelFingerprint(std::string_view architecture,
                             const std::vector<std::vector<ParamSpec>>& layers);

// A flat fp32 buffer given as consecutive pieces whose concatenation is the buffer: one piece when
// it is contiguous, the layer's shards (workers/shard_layout.h) otherwise.
using ConstPieces = std::vector<std::span<const float>>;
using Pieces = std::vector<std::span<float>>;

// What CheckpointWriter::WriteLayer saves; each buffer holds NumElements(params) floats. Borrowed:
// the caller keeps the memory alive and unchanged during the call.
struct LayerState {
  std::vector<ParamSpec> params;
  ConstPieces master, exp_avg, exp_avg_sq;
  int64_t adam_step = 0;  // AdamW updates applied to this layer (its bias correction)
  // Compact states ("bf16", "int8"; empty: exp_avg/exp_avg_sq above): the layer's state regions
  // (workers::StateRegionBytes bytes each), written as they are.
  std::string state_dtype = {};
  std::span<const uint8_t> exp_avg_region = {}, exp_avg_sq_region = {};
  // A bf16 master ("bf16"; with compact states only): its region (workers::MasterRegionBytes),
  // written beside the states; `master` above holds its fp32 value (master + compensation).
  std::string master_dtype = "fp32";
  std::span<const uint8_t> master_region = {};
};

// Where CheckpointReader::ReadLayer puts a layer. An empty exp_avg or exp_avg_sq is skipped (a new
// job that takes only the weights).
struct LayerTarget {
  std::vector<ParamSpec> params;
  Pieces master, exp_avg, exp_avg_sq;
  // Compact states: the layer's state regions, each of exactly the size written (the checkpoint
  // must hold compact states of `state_dtype`).
  std::string state_dtype = {};
  std::span<uint8_t> exp_avg_region = {}, exp_avg_sq_region = {};
  // A bf16 master ("bf16"): its region, of exactly the size written (the file's "master_dtype"
  // must be it).
  std::string master_dtype = "fp32";
  std::span<uint8_t> master_region = {};
};

struct SchedulerState {  // trainer/lr_schedule.h's inputs, Hugging Face names
  std::string lr_scheduler_type;
  double learning_rate = 0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;
};

struct LogEntry {  // one logged optimizer step, as in the Hugging Face trainer_state.json
  int64_t step = 0;
  double epoch = 0, loss = 0, learning_rate = 0, grad_norm = 0;
  friend bool operator==(const LogEntry&, const LogEntry&) = default;
};

// offloadd_state.json. Doubles round-trip exactly (NaN and infinities included).
struct TrainerState {
  int64_t global_step = 0;  // optimizer steps done; equals the checkpoint's step
  int64_t max_steps = 0;
  double epoch = 0;  // fractional epochs seen
  int64_t num_input_tokens_seen = 0;
  uint64_t seed = 0;
  // Opaque to the checkpoint (UTF-8 text); they round-trip byte for byte.
  std::string rng_state;
  std::string data_cursor;  // text::Batcher::SaveState()
  SchedulerState scheduler;
  std::string model_fingerprint;  // ModelFingerprint() of the model trained
  std::vector<LogEntry> log_history;
  // fp16 dynamic loss scaling ("grad_scaler" in the JSON); absent for bf16 / fp32 runs.
  std::optional<GradScalerState> grad_scaler;
  // The shape per_device_train_batch_size auto chose ("auto_batch_size" in the JSON), which a
  // resumed run keeps instead of pricing again; absent when the batch was given.
  struct BatchShape {
    int64_t micro = 0, accumulation = 0;
    friend bool operator==(const BatchShape&, const BatchShape&) = default;
  };
  std::optional<BatchShape> auto_batch;
  // The optimizer mode the states were trained in ("optimizer" in the JSON; the job spec's
  // optimizer.state_dtype / master_dtype names, docs/optimizer-modes.md). Absent in checkpoints
  // written before it existed: exact (fp32, fp32).
  std::string state_dtype = "fp32";
  std::string master_dtype = "fp32";
  // Only for the Hugging Face trainer_state.json beside it (not read back): the run's settings
  // that HF's TrainerState records.
  struct HfSettings {
    int64_t logging_steps = 500, eval_steps = 500, save_steps = 500;
    int64_t train_batch_size = 0;  // sequences per optimizer step; 0 writes null
    double num_train_epochs = 0;
    double total_flos = 0;
  };
  HfSettings hf;
};

struct CheckpointInfo {
  std::string path;  // output_dir/checkpoint-<step>
  int64_t step = 0;
  uint64_t size_bytes = 0;  // all files
};

// Writes one checkpoint. Not thread-safe: call from one thread. Destroying (or moving over) an
// uncommitted writer removes its temporary directory; a killed process leaves it behind for
// LatestCheckpoint to remove.
class CheckpointWriter {
 public:
  // Creates output_dir (mkdir -p) and output_dir/.checkpoint-<step>.tmp-XXXXXX.
  static StatusOr<CheckpointWriter> Begin(const std::string& output_dir, int64_t step);
  CheckpointWriter(CheckpointWriter&& other) noexcept;
  CheckpointWriter& operator=(CheckpointWriter&& other) noexcept;
  ~CheckpointWriter();

  // Writes and fsyncs the layer's two files. Layers may come in any order but each once; the
  // params must have unique non-empty names and non-negative dimensions.
  Status WriteLayer(int layer, const LayerState& state);
  // A small extra file (config.json, tokenizer files) so that the directory is a loadable model.
  Status AddFile(const std::string& name, std::string_view contents);
  // Needs layers 0..n-1 written and state.global_step == step. Writes the index and
  // trainer_state.json, fsyncs, renames to output_dir/checkpoint-<step> and fsyncs output_dir. An
  // existing checkpoint of that step is swapped out atomically (renameat2 RENAME_EXCHANGE: ext4,
  // xfs, btrfs, tmpfs) and then deleted. The writer is spent afterwards, whatever the outcome.
  StatusOr<CheckpointInfo> Commit(const TrainerState& state);

  const std::string& tmp_dir() const { return tmp_dir_; }

 private:
  Status WriteCompactStates(int layer, const LayerState& state);  // the optimizer file, compact
  CheckpointWriter() = default;
  void Abandon();

  std::string output_dir_, tmp_dir_;
  std::string tmp_name_;  // tmp_dir_'s name inside output_dir
  int64_t step_ = 0;
  int out_fd_ = -1;   // output_dir, opened once by Begin; every operation is relative to it
  int lock_fd_ = -1;  // tmp_dir_, flock'ed: tells LatestCheckpoint the writer is alive
  std::map<int, std::vector<std::string>> layer_params_;  // layer -> parameter names
  std::map<std::string, uint64_t> files_;                 // file name -> bytes
  std::map<std::string, uint32_t> crcs_;                  // file name -> crc32c of its bytes
  uint64_t weight_bytes_ = 0;                             // master tensors, all layers
};

// Deletes the oldest checkpoints of output_dir beyond the newest `keep` (Hugging Face
// save_total_limit; <= 0 keeps all). Only valid checkpoints count and get deleted, so the one
// LatestCheckpoint returns always stays. Each is renamed to a hidden name before removal.
Status PruneCheckpoints(const std::string& output_dir, int64_t keep);

// Deletes every output_dir/checkpoint-<step> (Hugging Face overwrite_output_dir: a job that starts
// over in a directory holding another run's checkpoints), each hidden before removal.
Status RemoveCheckpoints(const std::string& output_dir);

// The newest valid output_dir/checkpoint-<step> whose files all match their crc32c (NOT_FOUND if
// none; invalid or corrupt newer ones are skipped with a warning naming the file). Reads every
// file of the checkpoints it checks. Also removes temporary directories of writers that died, and
// the temporary files of an export that died (RemoveExportTemporaries, export_files.h).
StatusOr<std::string> LatestCheckpoint(const std::string& output_dir);

// Reads one checkpoint. Open parses trainer_state.json and checks that every file is there with
// its recorded size; ReadLayer fully validates the layer's files. Thread-safe after Open.
class CheckpointReader {
 public:
  // A non-empty expected_fingerprint must equal the checkpoint's (FAILED_PRECONDITION naming
  // both otherwise); empty accepts any model.
  // The checkpoint's optimizer mode must be the run's (`state_dtype`/`master_dtype`, exact by
  // default): its states are read as they are stored, never converted, so a mode change is
  // FAILED_PRECONDITION naming both modes.
  static StatusOr<CheckpointReader> Open(const std::string& dir,
                                         std::string_view expected_fingerprint = {},
                                         std::string_view state_dtype = "fp32",
                                         std::string_view master_dtype = "fp32");

  const std::string& dir() const { return dir_; }
  const TrainerState& state() const { return state_; }
  int num_layers() const { return num_layers_; }
  // Copies the layer's tensors into `target` after checking that the files hold exactly
  // target.params (names, shapes, F32) and that the buffers have the right size. Returns the
  // layer's adam_step (0 when both moments are skipped). The files read are checked against their
  // crc32c first: DATA_LOSS naming the file when they differ.
  StatusOr<int64_t> ReadLayer(int layer, const LayerTarget& target) const;

  // Reads every file of the checkpoint and checks its crc32c (DATA_LOSS naming the first file
  // that differs). OK, with a warning, for a checkpoint written without checksums.
  Status Verify() const;
  bool has_checksums() const { return !crcs_.empty(); }

 private:
  Status VerifyFile(const std::string& name) const;
  StatusOr<int64_t> ReadCompactStates(int layer, const LayerTarget& target) const;

  std::string dir_;
  TrainerState state_;
  int num_layers_ = 0;
  std::map<std::string, uint64_t> files_;  // name -> bytes, from trainer_state.json
  std::map<std::string, uint32_t> crcs_;   // name -> crc32c; empty for an older checkpoint
};

}  // namespace offloadd::trainer
