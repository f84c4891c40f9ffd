// The offloadd <-> offloadd-executor wire protocol: every message survives a round trip through a
// real SOCK_SEQPACKET socketpair (large ones in chunks), a peer of another version is refused by
// name, and garbled, oversized or cut-off messages are refused with an error, never a crash.
#include "job/executor_protocol.h"

#include <sys/socket.h>

#include <cstring>
#include <string>
#include <thread>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>
#include <gtest/gtest.h>

#include "ipc/fd_passing.h"
#include "ipc/message_channel.h"

namespace offloadd::daemon {
namespace {

namespace pb = offloadd::internal;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Sets every scalar field of `m` (and of its sub-messages, one level of repeated entries) to a
// distinct non-default value, so that a field a conversion forgets shows as a difference.
void FillDistinct(Message* m, int* counter) {
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->containing_oneof() != nullptr) continue;
    const int v = ++*counter;
    if (f->is_repeated()) {
      switch (f->cpp_type()) {
        case FieldDescriptor::CPPTYPE_MESSAGE: FillDistinct(r->AddMessage(m, f), counter); break;
        case FieldDescriptor::CPPTYPE_STRING: r->AddString(m, f, "s" + std::to_string(v)); break;
        case FieldDescriptor::CPPTYPE_DOUBLE: r->AddDouble(m, f, v + 0.5); break;
        case FieldDescriptor::CPPTYPE_UINT64: r->AddUInt64(m, f, static_cast<uint64_t>(v)); break;
        default: break;
      }
      continue;
    }
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, v); break;
      case FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, int64_t{v} << 33); break;
      case FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, static_cast<uint32_t>(v)); break;
      case FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, uint64_t{static_cast<uint64_t>(v)} << 34); break;
      case FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, v + 0.25); break;
      case FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, true); break;
      case FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, "v" + std::to_string(v)); break;
      case FieldDescriptor::CPPTYPE_MESSAGE: FillDistinct(r->MutableMessage(m, f), counter); break;
      default: break;
    }
  }
}

template <typename T>
T Distinct() {
  T m;
  int counter = 0;
  FillDistinct(&m, &counter);
  return m;
}

class ProtocolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pair = ipc::MakeSocketPair();
    ASSERT_TRUE(pair.ok()) << pair.status().ToString();
    a_ = std::move(pair->first);
    b_ = std::move(pair->second);
  }
  // Sends from a thread (a large message fills the socket buffer before the reader drains it).
  template <typename T>
  T RoundTrip(const T& sent) {
    std::thread writer([&] { EXPECT_TRUE(SendProto(a_.get(), sent).ok()); });
    T got;
    const Status s = RecvProto(b_.get(), &got);
    writer.join();
    EXPECT_TRUE(s.ok()) << s.ToString();
    return got;
  }
  ipc::UniqueFd a_, b_;
};

TEST_F(ProtocolTest, EveryDaemonMessageRoundTrips) {
  pb::DaemonMessage hello;
  *hello.mutable_hello() = MakeHello(kDaemonProgram);
  EXPECT_EQ(RoundTrip(hello).SerializeAsString(), hello.SerializeAsString());
  pb::DaemonMessage start;
  *start.mutable_start() = Distinct<pb::StartJob>();
  EXPECT_EQ(RoundTrip(start).SerializeAsString(), start.SerializeAsString());
  pb::DaemonMessage control;
  control.mutable_control()->set_action(pb::Control::ACTION_PAUSE);
  EXPECT_EQ(RoundTrip(control).control().action(), pb::Control::ACTION_PAUSE);
}

TEST_F(ProtocolTest, EveryExecutorMessageRoundTrips) {
  std::vector<pb::ExecutorMessage> all(9);
  *all[0].mutable_hello() = MakeHello(kExecutorProgram);
  *all[1].mutable_progress() = Distinct<offloadd::v1::JobProgress>();
  *all[2].mutable_log() = Distinct<pb::LogLine>();
  *all[3].mutable_checkpoint() = Distinct<offloadd::v1::Checkpoint>();
  *all[4].mutable_step() = Distinct<pb::StepStats>();
  *all[5].mutable_eval() = Distinct<pb::EvalStats>();
  *all[6].mutable_projector_check() = Distinct<pb::ProjectorCheckStats>();
  *all[7].mutable_runtime() = Distinct<pb::RuntimeStats>();
  *all[8].mutable_finished() = ToFinished(InvalidArgumentError("bad record"));
  for (const auto& m : all) {
    EXPECT_EQ(RoundTrip(m).SerializeAsString(), m.SerializeAsString()) << m.kind_case();
  }
}

// The structs the trainer and the daemon use keep every field through their wire messages.
TEST(ProtocolConversions, StructsKeepEveryField) {
  const auto step = Distinct<pb::StepStats>();
  EXPECT_EQ(ToProto(FromProto(step)).SerializeAsString(), step.SerializeAsString());
  const auto eval = Distinct<pb::EvalStats>();
  EXPECT_EQ(ToProto(FromProto(eval)).SerializeAsString(), eval.SerializeAsString());
  const auto check = Distinct<pb::ProjectorCheckStats>();
  EXPECT_EQ(ToProto(FromProto(check)).SerializeAsString(), check.SerializeAsString());
  auto runtime = Distinct<pb::RuntimeStats>();
  // Not the trainer's: the executor sets it from its own count (ipc::WatchdogKills) after the
  // conversion, and the daemon reads it from the message.
  runtime.clear_worker_watchdog_kills();
  EXPECT_EQ(ToProto(FromProto(runtime)).SerializeAsString(), runtime.SerializeAsString());
  pb::Placement p;
  p.set_world_size(2);
  p.set_rank(1);
  p.set_rendezvous("file:///tmp/r");
  p.set_timeout_seconds(30);
  const trainer::ParallelConfig c = ParallelFromPlacement(p);
  EXPECT_EQ(c.world_size, 2);
  EXPECT_EQ(c.rank, 1);
  EXPECT_EQ(c.rendezvous, "file:///tmp/r");
  EXPECT_EQ(c.timeout_seconds, 30);
  EXPECT_EQ(c.hosts, 1);  // unset: one host
  p.set_hosts(2);
  EXPECT_EQ(ParallelFromPlacement(p).hosts, 2);
  EXPECT_TRUE(FromFinished(ToFinished(OkStatus())).ok());
  const Status s = FromFinished(ToFinished(ResourceExhaustedError("full")));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "full");
  pb::Finished garbage;
  garbage.set_code(999);
  EXPECT_EQ(FromFinished(garbage).code(), StatusCode::kInternal);
}

// A job far larger than one datagram (the socket's send buffer is about 200 KiB) goes in chunks.
TEST_F(ProtocolTest, MessagesLargerThanADatagramArriveWhole) {
  pb::DaemonMessage start;
  auto* spec = start.mutable_start()->mutable_job()->mutable_spec();
  for (int i = 0; i < 20000; ++i) spec->mutable_dataset()->add_paths("/data/shard-" + std::to_string(i) + ".jsonl");
  ASSERT_GT(start.ByteSizeLong(), 3 * ipc::kMaxChunkBytes + 17);
  const auto got = RoundTrip(start);
  EXPECT_EQ(got.SerializeAsString(), start.SerializeAsString());
  // An empty message is one header-only datagram.
  pb::DaemonMessage empty;
  EXPECT_EQ(RoundTrip(empty).kind_case(), pb::DaemonMessage::KIND_NOT_SET);
}

TEST(ProtocolHello, OtherVersionOrProgramIsRefusedByName) {
  pb::Hello h = MakeHello(kExecutorProgram);
  EXPECT_TRUE(CheckHello(h, kExecutorProgram).ok());
  EXPECT_GT(h.pid(), 0);
  h.set_protocol_version(kExecutorProtocolVersion + 1);
  const Status s = CheckHello(h, kExecutorProgram);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("offloadd-executor speaks executor protocol version 2"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("this offloadd speaks version 1"), std::string::npos) << s.message();
  const Status wrong = CheckHello(MakeHello("offloadd-store"), kExecutorProgram);
  EXPECT_EQ(wrong.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(wrong.message().find("offloadd-store"), std::string::npos);
}

TEST_F(ProtocolTest, GarbledDatagramsAreRefused) {
  pb::ExecutorMessage m;
  // No header at all.
  ASSERT_EQ(::send(a_.get(), "x", 1, 0), 1);
  Status s = RecvProto(b_.get(), &m);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s.ToString();
  // Another magic.
  ipc::ChunkHeader h{0xdeadbeef, 4, 0};
  char buf[sizeof h + 4] = {};
  std::memcpy(buf, &h, sizeof h);
  ASSERT_EQ(::send(a_.get(), buf, sizeof buf, 0), static_cast<ssize_t>(sizeof buf));
  s = RecvProto(b_.get(), &m);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("magic"), std::string::npos);
  // A first chunk that does not start at offset 0.
  h = {ipc::kChunkMagic, 8, 4};
  std::memcpy(buf, &h, sizeof h);
  ASSERT_EQ(::send(a_.get(), buf, sizeof buf, 0), static_cast<ssize_t>(sizeof buf));
  EXPECT_EQ(RecvProto(b_.get(), &m).code(), StatusCode::kDataLoss);
  // A whole message whose bytes are not an ExecutorMessage.
  ASSERT_TRUE(ipc::SendMessage(a_.get(), std::string("\xff\xff\xff\xff\xff", 5)).ok());
  s = RecvProto(b_.get(), &m);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("offloadd.internal.ExecutorMessage"), std::string::npos) << s.message();
}

TEST_F(ProtocolTest, OversizedMessageIsRefusedBeforeItIsRead) {
  ipc::ChunkHeader h{ipc::kChunkMagic, static_cast<uint32_t>(kMaxExecutorMessageBytes + 1), 0};
  ASSERT_EQ(::send(a_.get(), &h, sizeof h, 0), static_cast<ssize_t>(sizeof h));
  pb::ExecutorMessage m;
  EXPECT_EQ(RecvProto(b_.get(), &m).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ipc::SendMessage(a_.get(), std::span<const uint8_t>(static_cast<const uint8_t*>(nullptr),
                                                                ipc::kMaxMessageBytes + 1)).code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ProtocolTest, PeerGoneBeforeOrInsideAMessage) {
  // In the middle: the first of two chunks, then the peer closes.
  ipc::ChunkHeader h{ipc::kChunkMagic, 10, 0};
  char buf[sizeof h + 4] = {};
  std::memcpy(buf, &h, sizeof h);
  ASSERT_EQ(::send(a_.get(), buf, sizeof buf, 0), static_cast<ssize_t>(sizeof buf));
  a_.reset();
  pb::ExecutorMessage m;
  EXPECT_EQ(RecvProto(b_.get(), &m).code(), StatusCode::kDataLoss);
  // Before a message: UNAVAILABLE, and sending to it too.
  EXPECT_EQ(RecvProto(b_.get(), &m).code(), StatusCode::kUnavailable);
  EXPECT_EQ(SendProto(b_.get(), m).code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace offloadd::daemon
