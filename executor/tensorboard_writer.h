#pragma once
// TensorBoard event files (training.report_to: tensorboard), written natively: a TFRecord file of
// Event protos (proto/offloadd/internal/tensorboard.proto, TensorBoard's field numbers), read by
// TensorBoard and its EventAccumulator like the files TensorFlow or PyTorch's SummaryWriter write.
//
// File: <dir>/events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, a new one per writer (a
// restarted or resumed job adds a file; TensorBoard reads a directory's files in name order and
// drops a curve's points past a step that comes again). Its first record is the file_version
// event "brain.Event:2"; each AddScalars call is one Event{wall_time, step, summary} record.
//
// Record framing (TFRecord): uint64 length, uint32 masked_crc32c(length bytes), the data, uint32
// masked_crc32c(data), little-endian; masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2^32).
// Every record is written with one write(2) straight to the file (no user-space buffer), so what
// a step wrote is in the file when AddScalars returns, also if the process dies next.
//
// Not thread-safe: one writer per job, used from the thread that trains.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/safe_path.h"
#include "common/status.h"
#include "job/step_stats.h"

namespace offloadd::executor {

// TFRecord's checksum of `data`: CRC-32C, rotated and offset as above.
uint32_t MaskedCrc32c(std::string_view data);
// One TFRecord record around `data`.
std::string FrameRecord(std::string_view data);

class EventFileWriter {
 public:
  // Creates `dir` (confined for writing, common/safe_path.h) and a new event file in it, and writes
  // the file_version record. Errors name the file.
  static StatusOr<std::unique_ptr<EventFileWriter>> Create(const std::string& dir);

  // One Event at `step` with a scalar per (tag, value); `wall_time`: seconds since the epoch.
  // Values are stored as float (TensorBoard's simple_value).
  Status AddScalars(int64_t step, const std::vector<std::pair<std::string, double>>& values,
                    double wall_time);
  const std::string& path() const { return path_; }

 private:
  EventFileWriter(OwnedFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  Status WriteRecord(const std::string& data);

  OwnedFd fd_;
  std::string path_;
};

// The scalars of one optimizer step, with transformers' TensorBoardCallback tags: train/loss,
// train/learning_rate, train/grad_norm, train/tokens_per_second (input tokens / step seconds, as
// JobProgress), and train/aux_loss when the model reports a router loss (non-zero).
std::vector<std::pair<std::string, double>> StepScalars(const trainer::StepStats& s);

// Seconds since the Unix epoch, with the sub-second part (an Event's wall_time).
double WallTimeNow();

}  // namespace offloadd::executor
