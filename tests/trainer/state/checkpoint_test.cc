#include "tests/trainer/state/checkpoint_testlib.h"

namespace offloadd::trainer {
namespace {

TEST_F(CheckpointTest, RoundTripIsBitExact) {
  const FakeModel m(1);
  auto info = Save(out_, 7, m);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->path, Dir(7));
  EXPECT_EQ(info->step, 7);
  uint64_t bytes = 0;
  for (const std::string& f : Entries(Dir(7))) {
    struct stat st {};
    ASSERT_EQ(::stat(JoinPath(Dir(7), f).c_str(), &st), 0);
    bytes += st.st_size;
  }
  EXPECT_EQ(info->size_bytes, bytes);
  EXPECT_EQ(Entries(out_), std::vector<std::string>{"checkpoint-7"});  // no temporary left
  ExpectHolds(Dir(7), m);

  auto r = CheckpointReader::Open(Dir(7));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const TrainerState want = MakeState(7, m);
  const TrainerState& got = r->state();
  EXPECT_EQ(got.global_step, 7);
  EXPECT_EQ(got.max_steps, want.max_steps);
  EXPECT_EQ(got.epoch, want.epoch);
  EXPECT_EQ(got.num_input_tokens_seen, want.num_input_tokens_seen);
  EXPECT_EQ(got.seed, want.seed);
  EXPECT_EQ(got.rng_state, want.rng_state);
  EXPECT_EQ(got.data_cursor, want.data_cursor);
  EXPECT_EQ(got.scheduler.lr_scheduler_type, "cosine");
  EXPECT_EQ(got.scheduler.learning_rate, 2e-5);
  EXPECT_EQ(got.scheduler.warmup_steps, 10);
  EXPECT_EQ(got.scheduler.total_steps, 1000);
  EXPECT_EQ(got.model_fingerprint, m.fingerprint());
  ASSERT_TRUE(got.grad_scaler.has_value());
  EXPECT_EQ(got.grad_scaler->scale, 0x1p-3f);
  EXPECT_EQ(got.grad_scaler->growth_tracker, 7);
  EXPECT_EQ(got.auto_batch, (TrainerState::BatchShape{.micro = 16, .accumulation = 7}));
  ASSERT_EQ(got.log_history.size(), want.log_history.size());
  for (size_t i = 0; i < want.log_history.size(); ++i) {
    const LogEntry &a = got.log_history[i], &b = want.log_history[i];
    EXPECT_EQ(a.step, b.step);
    EXPECT_TRUE(SameDouble(a.epoch, b.epoch) && SameDouble(a.loss, b.loss) &&
                SameDouble(a.learning_rate, b.learning_rate) &&
                SameDouble(a.grad_norm, b.grad_norm))
        << "log_history[" << i << "]";
  }

  // Read into pieces, and weights only (a new job that starts its optimizer afresh).
  std::vector<float> w(m.master[1].size());
  const size_t cut = 5;
  auto step =
      r->ReadLayer(1, {m.params[1], {std::span(w).first(cut), std::span(w).subspan(cut)}, {}, {}});
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  EXPECT_EQ(*step, 0);
  EXPECT_TRUE(SameBits(w, m.master[1]));
}

TEST_F(CheckpointTest, GradScalerStateIsOptional) {  // bf16 / fp32 runs have none
  const FakeModel m(2);
  ASSERT_TRUE(Save(out_, 4, m).ok());
  auto r = CheckpointReader::Open(Dir(4));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->state().grad_scaler.has_value());
  EXPECT_FALSE(r->state().auto_batch.has_value()) << "a fixed batch records no automatic choice";
}

TEST_F(CheckpointTest, MasterWeightsLoadAsAShardedModel) {
  const FakeModel m(2);
  ASSERT_TRUE(Save(out_, 3, m).ok());
  auto ck = engine::Checkpoint::Open(Dir(3));
  ASSERT_TRUE(ck.ok()) << ck.status().ToString();
  EXPECT_TRUE((*ck)->sharded());
  EXPECT_EQ((*ck)->Names().size(), 6u);
  auto e = (*ck)->Get("lm_head.weight");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->info->dtype, engine::DType::kF32);
  EXPECT_EQ(e->info->shape, (std::vector<int64_t>{16, 8}));
  // lm_head follows model.norm.weight (8 floats) in layer 2's flat buffer.
  EXPECT_EQ(std::memcmp(e->file->data(*e->info).data(), m.master[2].data() + 8, 16 * 8 * 4), 0);
  EXPECT_EQ(*(*ck)->ShardOf("model.embed_tokens.weight"), "model-layer-00000.safetensors");
}

TEST_F(CheckpointTest, AddedFilesAreKeptAndChecked) {
  const FakeModel m(3);
  auto w = CheckpointWriter::Begin(out_, 1);
  ASSERT_TRUE(w.ok());
  for (int l = 0; l < m.layers(); ++l) ASSERT_TRUE(w->WriteLayer(l, m.State(l)).ok());
  ASSERT_TRUE(w->AddFile("config.json", R"({"model_type": "llama"})").ok());
  EXPECT_FALSE(w->AddFile("../escape", "x").ok());
  EXPECT_FALSE(w->AddFile("trainer_state.json", "x").ok());
  ASSERT_TRUE(w->Commit(MakeState(1, m)).ok());
  auto text = ReadFile(JoinPath(Dir(1), "config.json"));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, R"({"model_type": "llama"})");
  ASSERT_EQ(::truncate(JoinPath(Dir(1), "config.json").c_str(), 3), 0);
  auto r = CheckpointReader::Open(Dir(1));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("config.json is 3 bytes"));
}

TEST_F(CheckpointTest, SavingAStepAgainReplacesItsCheckpoint) {
  ASSERT_TRUE(Save(out_, 5, FakeModel(1)).ok());
  const FakeModel m(2);
  ASSERT_TRUE(Save(out_, 5, m).ok());
  EXPECT_EQ(Entries(out_), std::vector<std::string>{"checkpoint-5"});
  ExpectHolds(Dir(5), m);
}

TEST_F(CheckpointTest, PruneKeepsTheNewestValidCheckpoints) {
  const FakeModel m(1);
  ASSERT_EQ(::mkdir(Dir(1).c_str(), 0755), 0);  // not a checkpoint: neither counted nor deleted
  for (int64_t step : {10, 20, 30, 40}) {
    ASSERT_TRUE(Save(out_, step, m).ok());
    ASSERT_TRUE(PruneCheckpoints(out_, 0).ok());  // 0: keep all
  }
  ASSERT_EQ(Entries(out_).size(), 5u);
  ASSERT_TRUE(PruneCheckpoints(out_, 2).ok());
  EXPECT_EQ(Entries(out_),
            (std::vector<std::string>{"checkpoint-1", "checkpoint-30", "checkpoint-40"}));
  ASSERT_TRUE(PruneCheckpoints(out_, 1).ok());
  EXPECT_EQ(Entries(out_), (std::vector<std::string>{"checkpoint-1", "checkpoint-40"}));
  ExpectHolds(Dir(40), m);
}

TEST_F(CheckpointTest, LatestSkipsTemporaryAndIncompleteDirectories) {
  EXPECT_EQ(LatestCheckpoint(out_).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(LatestCheckpoint(JoinPath(out_, "absent")).status().code(), StatusCode::kNotFound);

  const FakeModel m(1);
  ASSERT_TRUE(Save(out_, 10, m).ok());
  ASSERT_TRUE(Save(out_, 20, m).ok());
  // Newer but incomplete: a crashed writer's temporary, a directory without offloadd_state.json,
  // names that are not checkpoint-<step>.
  const std::string stale = JoinPath(out_, ".checkpoint-30.tmp-abcdef");
  ASSERT_EQ(::mkdir(stale.c_str(), 0755), 0);
  ASSERT_TRUE(
      CopyFile(JoinPath(Dir(20), "offloadd_state.json"), JoinPath(stale, "offloadd_state.json"))
          .ok());
  ASSERT_EQ(::mkdir(Dir(40).c_str(), 0755), 0);
  ASSERT_TRUE(CopyFile(JoinPath(Dir(20), "model-layer-00000.safetensors"),
                       JoinPath(Dir(40), "model-layer-00000.safetensors"))
                  .ok());
  ASSERT_EQ(::mkdir(JoinPath(out_, "checkpoint-50x").c_str(), 0755), 0);
  ASSERT_TRUE(
      CopyFile(JoinPath(Dir(20), "offloadd_state.json"), JoinPath(out_, "checkpoint-60")).ok());
  // A live writer's temporary stays.
  auto live = CheckpointWriter::Begin(out_, 70);
  ASSERT_TRUE(live.ok());

  auto latest = LatestCheckpoint(out_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, Dir(20));
  EXPECT_FALSE(PathExists(stale));
  EXPECT_TRUE(PathExists(live->tmp_dir()));
  const std::string live_tmp = live->tmp_dir();
  { CheckpointWriter gone = std::move(*live); }  // an abandoned writer cleans up
  EXPECT_FALSE(PathExists(live_tmp));
}

// A checkpoint another process holds locked (a pruner, a resume's clean-up) is not removed from
// under it: the removal is refused naming the directory, and goes ahead once the lock is gone.
TEST_F(CheckpointTest, ALockedCheckpointIsNotRemovedFromUnderItsHolder) {
  const FakeModel m(1);
  ASSERT_TRUE(Save(out_, 10, m).ok());
  const int held = ::open(Dir(10).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);  // another open file description: conflicts
  const Status refused = RemoveCheckpoints(out_);
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.ToString();
  EXPECT_NE(refused.message().find(Dir(10) + " is locked by a live process"), std::string::npos)
      << refused.ToString();
  EXPECT_TRUE(PathExists(Dir(10)));
  ::close(held);
  ASSERT_TRUE(RemoveCheckpoints(out_).ok());
  EXPECT_FALSE(PathExists(Dir(10)));
}

TEST_F(CheckpointTest, WriterRefusesInconsistentInput) {
  const FakeModel m(1);
  auto w = CheckpointWriter::Begin(out_, 4);
  ASSERT_TRUE(w.ok());
  const std::string tmp = w->tmp_dir();
  LayerState bad = m.State(0);
  bad.exp_avg[0] = bad.exp_avg[0].first(3);
  Status st = w->WriteLayer(0, bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(),
              HasSubstr("layer 0 exp_avg: buffer holds 3 floats, the layer's parameters need 128"));
  ASSERT_TRUE(w->WriteLayer(0, m.State(0)).ok());
  EXPECT_EQ(w->WriteLayer(0, m.State(0)).code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(w->WriteLayer(2, m.State(2)).ok());
  auto info = w->Commit(MakeState(4, m));
  ASSERT_FALSE(info.ok());
  EXPECT_THAT(info.status().message(), HasSubstr("layer 1 was not written"));
  EXPECT_FALSE(PathExists(tmp));  // a failed commit leaves nothing
  EXPECT_FALSE(PathExists(Dir(4)));
  EXPECT_EQ(w->WriteLayer(1, m.State(1)).code(), StatusCode::kFailedPrecondition);  // spent

  auto w2 = CheckpointWriter::Begin(out_, 5);
  ASSERT_TRUE(w2.ok());
  for (int l = 0; l < m.layers(); ++l) ASSERT_TRUE(w2->WriteLayer(l, m.State(l)).ok());
  EXPECT_THAT(w2->Commit(MakeState(6, m)).status().message(),
              HasSubstr("trainer state is at step 6, the checkpoint at 5"));
  EXPECT_EQ(Entries(out_), std::vector<std::string>{});
}

TEST_F(CheckpointTest, DamagedFilesAreClearErrors) {
  const FakeModel m(1);
  ASSERT_TRUE(Save(out_, 10, m).ok());
  ASSERT_TRUE(Save(out_, 20, m).ok());
  const std::string opt1 = JoinPath(Dir(20), "optimizer-layer-00001.safetensors");

  // Truncated: caught at Open from the recorded size; LatestCheckpoint falls back to step 10.
  struct stat st {};
  ASSERT_EQ(::stat(opt1.c_str(), &st), 0);
  ASSERT_EQ(::truncate(opt1.c_str(), st.st_size - 4), 0);
  auto r = CheckpointReader::Open(Dir(20));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(),
              HasSubstr(opt1 + " is " + std::to_string(st.st_size - 4) + " bytes"));
  EXPECT_THAT(r.status().message(), HasSubstr("truncated"));
  EXPECT_EQ(*LatestCheckpoint(out_), Dir(10));

  // Missing layer file.
  ASSERT_EQ(::unlink(opt1.c_str()), 0);
  r = CheckpointReader::Open(Dir(20));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(opt1 + " is missing"));

  // Same size but a damaged safetensors header: caught by ReadLayer's validation.
  const std::string model0 = JoinPath(Dir(10), "model-layer-00000.safetensors");
  const int fd = ::open(model0.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "[", 1, 8), 1);  // the header's '{'
  ::close(fd);
  r = CheckpointReader::Open(Dir(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<float> w(m.master[0].size());
  auto read = r->ReadLayer(0, {m.params[0], {w}, {}, {}});
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr(model0));

  // Bad JSON.
  const std::string state = JoinPath(Dir(10), "offloadd_state.json");
  ASSERT_EQ(::truncate(state.c_str(), 20), 0);
  r = CheckpointReader::Open(Dir(10));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(state + ": not a JSON object"));
  EXPECT_EQ(LatestCheckpoint(out_).status().code(), StatusCode::kNotFound);
}

// Flips one byte of `path` at `offset` (negative: from the end), keeping its size.
void FlipByte(const std::string& path, off_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  if (offset < 0) offset += st.st_size;
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, offset), 1);
  b ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &b, 1, offset), 1);
  ::close(fd);
}

// Flipped bytes in tensor data used to load silently.
TEST_F(CheckpointTest, FlippedTensorBytesAreDetectedAndLatestFallsBack) {
  const FakeModel m(1);
  ASSERT_TRUE(Save(out_, 10, m).ok());
  ASSERT_TRUE(Save(out_, 20, m).ok());
  const std::string model1 = JoinPath(Dir(20), "model-layer-00001.safetensors");
  FlipByte(model1, -5);  // inside the last tensor's data

  auto r = CheckpointReader::Open(Dir(20), m.fingerprint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();  // sizes still match
  std::vector<float> w(m.master[1].size()), a(w.size()), v(w.size());
  auto read = r->ReadLayer(1, {m.params[1], {w}, {a}, {v}});
  ASSERT_FALSE(read.ok()) << "corrupt tensor data was read without an error";
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss) << read.status().ToString();
  EXPECT_THAT(read.status().message(), HasSubstr(model1));
  EXPECT_THAT(read.status().message(), HasSubstr("checksum"));
  // The undamaged layers still read.
  std::vector<float> w0(m.master[0].size());
  EXPECT_TRUE(r->ReadLayer(0, {m.params[0], {w0}, {}, {}}).ok());

  // Resuming picks the previous, intact checkpoint.
  auto latest = LatestCheckpoint(out_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, Dir(10));
  ExpectHolds(*latest, m);
  auto verified = CheckpointReader::Open(Dir(20));
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->has_checksums());
  EXPECT_THAT(verified->Verify().ToString(), HasSubstr(model1 + ": checksum mismatch"));

  // Moments and the files added beside the layers are covered too.
  const std::string opt0 = JoinPath(Dir(10), "optimizer-layer-00000.safetensors");
  FlipByte(opt0, -1);
  r = CheckpointReader::Open(Dir(10), m.fingerprint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<float> a0(w0.size()), v0(w0.size());
  read = r->ReadLayer(0, {m.params[0], {w0}, {a0}, {v0}});
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr(opt0));
  EXPECT_EQ(LatestCheckpoint(out_).status().code(), StatusCode::kNotFound);
}

TEST_F(CheckpointTest, FlippedBytesInAnAddedFileOrTheIndexAreDetected) {
  const FakeModel m(2);
  for (int64_t step : {10, 20}) {
    auto w = CheckpointWriter::Begin(out_, step);
    ASSERT_TRUE(w.ok());
    for (int l = 0; l < m.layers(); ++l) ASSERT_TRUE(w->WriteLayer(l, m.State(l)).ok());
    ASSERT_TRUE(w->AddFile("config.json", R"({"model_type": "llama"})").ok());
    ASSERT_TRUE(w->Commit(MakeState(step, m)).ok());
  }
  FlipByte(JoinPath(Dir(20), "config.json"), 3);
  EXPECT_EQ(*LatestCheckpoint(out_), Dir(10));
  FlipByte(JoinPath(Dir(10), "model.safetensors.index.json"), 2);
  EXPECT_EQ(LatestCheckpoint(out_).status().code(), StatusCode::kNotFound);
}

// Beside offloadd's own state, trainer_state.json follows Hugging Face's TrainerState schema with
// the run's values; it is checksummed like every file.
TEST_F(CheckpointTest, TrainerStateJsonIsHuggingFacesSchema) {
  const FakeModel m(2);
  ASSERT_TRUE(Save(out_, 3, m).ok());
  auto text = ReadFile(JoinPath(Dir(3), "trainer_state.json"));
  ASSERT_TRUE(text.ok());
  const nlohmann::json hf = nlohmann::json::parse(*text);
  std::vector<std::string> keys;
  for (auto it = hf.begin(); it != hf.end(); ++it) keys.push_back(it.key());
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "best_global_step", "best_metric", "best_model_checkpoint", "epoch", "eval_steps",
                      "global_step", "is_hyper_param_search", "is_local_process_zero", "is_world_process_zero",
                      "log_history", "logging_steps", "max_steps", "num_input_tokens_seen", "num_train_epochs",
                      "save_steps", "stateful_callbacks", "total_flos", "train_batch_size", "trial_name",
                      "trial_params"}));
  EXPECT_EQ(hf["global_step"], 3);
  ASSERT_EQ(hf["log_history"].size(), 3u);
  EXPECT_EQ(hf["log_history"][1]["learning_rate"], 2e-5);  // the values, not zeros
  EXPECT_EQ(hf["log_history"][1]["step"], 2);
  // Checksummed: a flipped byte in it is found.
  const std::string path = JoinPath(Dir(3), "trainer_state.json");
  const int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "X", 1, 2), 1);
  ::close(fd);
  auto r = CheckpointReader::Open(Dir(3));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->Verify().code(), StatusCode::kDataLoss);
}

// Checkpoints of earlier builds (offloadd's state in trainer_state.json, no offloadd_state.json)
// still load; a Hugging Face Trainer's checkpoint is refused with advice.
TEST_F(CheckpointTest, LegacyLayoutLoadsAndHuggingFaceCheckpointsAreRefused) {
  const FakeModel m(2);
  ASSERT_TRUE(Save(out_, 5, m).ok());
  auto ours = ReadFile(JoinPath(Dir(5), "offloadd_state.json"));
  ASSERT_TRUE(ours.ok());
  nlohmann::json legacy = nlohmann::json::parse(*ours);
  legacy["files"].erase("trainer_state.json");
  legacy["crc32c"].erase("trainer_state.json");
  ASSERT_EQ(::unlink(JoinPath(Dir(5), "offloadd_state.json").c_str()), 0);
  ASSERT_EQ(::unlink(JoinPath(Dir(5), "trainer_state.json").c_str()), 0);
  {
    const std::string text = legacy.dump(2);
    const int fd = ::open(JoinPath(Dir(5), "trainer_state.json").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  auto r = CheckpointReader::Open(Dir(5));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state().global_step, 5);
  EXPECT_TRUE(r->Verify().ok());
  EXPECT_EQ(*LatestCheckpoint(out_), Dir(5));
  ExpectHolds(Dir(5), m);

  const std::string hf_dir = JoinPath(out_, "hf-checkpoint");
  ASSERT_EQ(::mkdir(hf_dir.c_str(), 0755), 0);
  {
    const std::string text = R"({"global_step": 10, "log_history": [], "best_metric": null})";
    const int fd = ::open(JoinPath(hf_dir, "trainer_state.json").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    ::close(fd);
  }
  auto hf = CheckpointReader::Open(hf_dir);
  ASSERT_FALSE(hf.ok());
  EXPECT_EQ(hf.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(hf.status().message(), HasSubstr("is a Hugging Face Trainer checkpoint"));
  EXPECT_THAT(hf.status().message(), HasSubstr("give the directory as model.path"));
}

TEST_F(CheckpointTest, CheckpointsWrittenBeforeChecksumsStillLoad) {
  const FakeModel m(3);
  ASSERT_TRUE(Save(out_, 10, m).ok());
  const std::string state = JoinPath(Dir(10), "offloadd_state.json");
  auto text = ReadFile(state);
  ASSERT_TRUE(text.ok());
  const size_t key = text->find("\"crc32c\": {");  // keys are sorted: it is first, a comma follows
  ASSERT_NE(key, std::string::npos) << *text;
  const size_t close = text->find("},", key);
  ASSERT_NE(close, std::string::npos) << *text;
  std::string old = text->substr(0, key) + text->substr(close + 2);
  ASSERT_EQ(::unlink(state.c_str()), 0);
  const int fd = ::open(state.c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_EQ(::write(fd, old.data(), old.size()), static_cast<ssize_t>(old.size()));
  ::close(fd);
  auto r = CheckpointReader::Open(Dir(10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->has_checksums());
  EXPECT_TRUE(r->Verify().ok());
  EXPECT_EQ(*LatestCheckpoint(out_), Dir(10));
  ExpectHolds(Dir(10), m);
}

TEST_F(CheckpointTest, AnotherModelIsRefused) {
  const FakeModel m(1);
  ASSERT_TRUE(Save(out_, 10, m).ok());
  FakeModel other(1);
  other.params[1][1].shape = {8, 12};  // same size, transposed
  ASSERT_NE(other.fingerprint(), m.fingerprint());
  EXPECT_THAT(m.fingerprint(), HasSubstr("llama/3 layers/"));

  auto r = CheckpointReader::Open(Dir(10), other.fingerprint());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("the checkpoint is of model \"" + m.fingerprint() +
                                              "\", this job's model is \"" + other.fingerprint()));

  // Without the fingerprint check, the shape check still catches it, naming file and tensor.
  r = CheckpointReader::Open(Dir(10));
  ASSERT_TRUE(r.ok());
  std::vector<float> w(other.master[1].size());
  auto read = r->ReadLayer(1, {other.params[1], {w}, {}, {}});
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(
      read.status().message(),
      HasSubstr("model-layer-00001.safetensors: tensor \"model.layers.0.mlp.up_proj.weight\" "
                "has shape [12, 8], this model's is [8, 12]"));
  std::vector<ParamSpec> fewer = {m.params[1][0], m.params[1][1]};
  w.resize(NumElements(fewer));
  read = r->ReadLayer(1, {fewer, {w}, {}, {}});
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(read.status().message(), HasSubstr("which layer 1 of this model does not have"));
  EXPECT_EQ(r->ReadLayer(3, {m.params[0], {w}, {}, {}}).status().code(), StatusCode::kOutOfRange);
}

// The optimizer mode is recorded; resuming in another one is refused naming both, a checkpoint
// without the record is exact, and an unknown mode is a clear error naming the key.
TEST_F(CheckpointTest, TheOptimizerModeIsRecordedAndAnotherIsRefused) {
  const FakeModel m(1);
  ASSERT_TRUE(Save(out_, 10, m).ok());
  auto r = CheckpointReader::Open(Dir(10), m.fingerprint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state().state_dtype, "fp32");
  EXPECT_EQ(r->state().master_dtype, "fp32");
  r = CheckpointReader::Open(Dir(10), m.fingerprint(), "int8", "fp32");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(
      r.status().message(),
      HasSubstr("the checkpoint's optimizer states are exact (fp32 master, fp32 states), this "
                "run's are not exact: fp32 master, int8 states"));

  auto begun = CheckpointWriter::Begin(out_, 20);
  ASSERT_TRUE(begun.ok()) << begun.status().ToString();
  CheckpointWriter w = std::move(*begun);
  for (int l = m.layers() - 1; l >= 0; --l) ASSERT_TRUE(w.WriteLayer(l, m.State(l)).ok());
  TrainerState compact = MakeState(20, m);
  compact.state_dtype = "bf16";
  compact.master_dtype = "bf16";
  ASSERT_TRUE(w.Commit(compact).ok());
  r = CheckpointReader::Open(Dir(20), m.fingerprint(), "bf16", "bf16");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  r = CheckpointReader::Open(Dir(20), m.fingerprint());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("are not exact: bf16 master, bf16 states, this run's are exact"));

  // Before the record existed: exact. An unknown mode names the key.
  const std::string state = JoinPath(Dir(10), "offloadd_state.json");
  auto text = ReadFile(state);
  ASSERT_TRUE(text.ok());
  const auto rewrite = [&](const nlohmann::json* optimizer) {
    nlohmann::json j = nlohmann::json::parse(*text);
    j.erase("optimizer");
    if (optimizer != nullptr) j["optimizer"] = *optimizer;
    const std::string changed = j.dump(2);
    ASSERT_EQ(::unlink(state.c_str()), 0);
    const int fd = ::open(state.c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_EQ(::write(fd, changed.data(), changed.size()), static_cast<ssize_t>(changed.size()));
    ::close(fd);
  };
  rewrite(nullptr);
  r = CheckpointReader::Open(Dir(10), m.fingerprint());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state().state_dtype, "fp32");
  const nlohmann::json int4 = {{"state_dtype", "int4"}, {"master_dtype", "fp32"}};
  rewrite(&int4);
  r = CheckpointReader::Open(Dir(10), m.fingerprint());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("names an unknown optimizer mode (state_dtype \"int4\""));
}

// Not a test of its own: writes a small checkpoint for tests/python/trainer/
// test_checkpoint_files.py to inspect with the safetensors package.
TEST(CheckpointSample, WritesSampleForPython) {
  const char* out = std::getenv("OFFLOADD_CHECKPOINT_SAMPLE_DIR");
  if (out == nullptr) GTEST_SKIP() << "OFFLOADD_CHECKPOINT_SAMPLE_DIR is not set";
  ParamSpec a{"model.norm.weight", {3}}, b{"lm_head.weight", {2, 3}};
  const std::vector<float> w = {1, 2, 3, 10, 11, 12, 13, 14, 15};
  std::vector<float> m(9), v(9);
  for (int i = 0; i < 9; ++i) m[i] = 0.5f * i, v[i] = 0.25f * i;
  auto writer = CheckpointWriter::Begin(out, 2);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  ASSERT_TRUE(writer->WriteLayer(0, {{a, b}, {w}, {m}, {v}, 2}).ok());
  TrainerState s;
  s.global_step = 2;
  s.model_fingerprint = ModelFingerprint("llama", {{a, b}});
  auto info = writer->Commit(s);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
}

// An export killed before its rename leaves
// ".model.safetensors.tmp-XXXXXXXXXXXX" (a whole model) in output_dir; the next resume
// (LatestCheckpoint) removes it, and nothing else.
TEST_F(CheckpointTest, ResumeRemovesTheTemporariesOfAKilledExport) {
  // The real writer, killed where the export would be renaming its file into place.
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto lock = ExportLock::Acquire(out_);
    if (!lock.ok()) ::_exit(2);
    (void)WriteFileAtomically(JoinPath(out_, "model.safetensors"), [](int fd) -> Status {
      const std::string weights(1 << 20, 'w');
      if (::write(fd, weights.data(), weights.size()) != static_cast<ssize_t>(weights.size()))
        ::_exit(3);
      ::kill(::getpid(), SIGKILL);  // the crash, before WriteFileAtomically renames
      return OkStatus();
    });
    ::_exit(4);
  }
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL) << wstatus;
  std::vector<std::string> left = Entries(out_);
  ASSERT_EQ(left.size(), 1u);
  EXPECT_TRUE(IsExportTemporaryName(left[0])) << left[0];
  EXPECT_EQ(left[0].rfind(".model.safetensors.tmp-", 0), 0u) << left[0];

  // Beside it: what is not an export temporary stays, and a symlink with such a name is not
  // followed (its target stays too).
  const FakeModel m(1);
  ASSERT_TRUE(Save(out_, 3, m).ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(out_, "config.json"), "{}").ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(out_, ".notes.tmp-xyz"), "keep").ok());
  ASSERT_TRUE(WriteFileAtomically(JoinPath(out_, "victim"), "keep").ok());
  ASSERT_EQ(
      ::symlink(JoinPath(out_, "victim").c_str(), JoinPath(out_, ".link.tmp-0123456789ab").c_str()),
      0);
  ASSERT_EQ(::mkdir(JoinPath(out_, ".dir.tmp-0123456789ab").c_str(), 0755), 0);

  auto latest = LatestCheckpoint(out_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, Dir(3));
  EXPECT_EQ(Entries(out_),
            (std::vector<std::string>{".dir.tmp-0123456789ab", ".link.tmp-0123456789ab",
                                      ".notes.tmp-xyz", "checkpoint-3", "config.json", "victim"}));

  // A live export's temporaries are left to it.
  {
    auto lock = ExportLock::Acquire(out_);
    ASSERT_TRUE(lock.ok()) << lock.status().ToString();
    ASSERT_TRUE(
        WriteFileAtomically(JoinPath(out_, ".model.safetensors.tmp-00000000beef"), "w").ok());
    ASSERT_TRUE(LatestCheckpoint(out_).ok());
    auto removed = RemoveExportTemporaries(out_);
    ASSERT_TRUE(removed.ok());
    EXPECT_TRUE(removed->empty());
  }
  auto removed = RemoveExportTemporaries(out_);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed,
            std::vector<std::string>{JoinPath(out_, ".model.safetensors.tmp-00000000beef")});
}

TEST(ExportTemporaryNameTest, MatchesOnlyTheAtomicWritersNames) {
  EXPECT_TRUE(IsExportTemporaryName(".model.safetensors.tmp-0123456789ab"));
  EXPECT_TRUE(IsExportTemporaryName(".model-00001-of-00002.safetensors.tmp-ffffffffffff"));
  EXPECT_FALSE(IsExportTemporaryName("model.safetensors.tmp-0123456789ab"));   // not hidden
  EXPECT_FALSE(IsExportTemporaryName(".model.safetensors.tmp-0123456789AB"));  // upper case
  EXPECT_FALSE(IsExportTemporaryName(".model.safetensors.tmp-0123456789a"));   // 11 digits
  EXPECT_FALSE(IsExportTemporaryName(".tmp-0123456789ab"));
  EXPECT_FALSE(IsExportTemporaryName(".checkpoint-3.tmp-01234f"));
}

}  // namespace
}  // namespace offloadd::trainer
