#include "executor/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include "common/crc32c.h"
#include "offloadd/internal/tensorboard.pb.h"

namespace offloadd::executor {

namespace {

namespace tb = offloadd::tensorboard;

void PutLittleEndian(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  // The name goes into a file name: keep it to characters that are safe there.
  std::string out;
  for (const char* c = host; *c != '\0'; ++c) out.push_back(*c == '/' ? '_' : *c);
  return out;
}

}  // namespace

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(0, data.data(), data.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  PutLittleEndian(out, data.size(), 8);
  PutLittleEndian(out, MaskedCrc32c(std::string_view(out.data(), 8)), 4);
  out.append(data);
  PutLittleEndian(out, MaskedCrc32c(data), 4);
  return out;
}

std::vector<std::pair<std::string, double>> StepScalars(const trainer::StepStats& s) {
  std::vector<std::pair<std::string, double>> out = {{"train/loss", s.loss},
                                                     {"train/learning_rate", s.learning_rate},
                                                     {"train/grad_norm", s.grad_norm}};
  if (s.step_seconds > 0) {
    out.emplace_back("train/tokens_per_second", static_cast<double>(s.tokens) / s.step_seconds);
  }
  if (s.aux_loss != 0) out.emplace_back("train/aux_loss", s.aux_loss);
  return out;
}

double WallTimeNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

StatusOr<std::unique_ptr<EventFileWriter>> EventFileWriter::Create(const std::string& dir) {
  ASSIGN_OR_RETURN(OwnedFd d, MakeDirsConfined(dir));
  (void)d;
  // Two writers of one process in the same second (a test, or a job restarted in-process) get
  // different names through the counter; O_EXCL never appends to another run's file.
  static std::atomic<int> counter{0};
  const double now = WallTimeNow();
  const std::string path = dir + "/events.out.tfevents." +
                           std::to_string(static_cast<int64_t>(now)) + "." + HostName() + "." +
                           std::to_string(::getpid()) + "." + std::to_string(counter++);
  ASSIGN_OR_RETURN(
      OwnedFd fd, OpenConfined(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND, Access::kWrite, 0644));
  std::unique_ptr<EventFileWriter> w(new EventFileWriter(std::move(fd), path));
  tb::Event e;
  e.set_wall_time(now);
  e.set_file_version("brain.Event:2");
  RETURN_IF_ERROR(w->WriteRecord(e.SerializeAsString()));
  return w;
}

Status EventFileWriter::AddScalars(int64_t step,
                                   const std::vector<std::pair<std::string, double>>& values,
                                   double wall_time) {
  tb::Event e;
  e.set_wall_time(wall_time);
  e.set_step(step);
  tb::Summary* s = e.mutable_summary();
  for (const auto& [tag, value] : values) {
    tb::Summary::Value* v = s->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return WriteRecord(e.SerializeAsString());
}

Status EventFileWriter::WriteRecord(const std::string& data) {
  const std::string record = FrameRecord(data);
  return WriteAll(fd_.get(), record.data(), record.size(), "TensorBoard event file " + path_);
}

}  // namespace offloadd::executor
