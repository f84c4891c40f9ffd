// Checkpoints of the compact optimizer modes (docs/optimizer-modes.md): the states are written in
// their own format (U8 tensors holding the workers' state regions, int8 block scales included),
// checksummed like every file, read back byte for byte, and refused when a run of another mode
// reads them.
#include "tests/trainer/state/checkpoint_testlib.h"

namespace offloadd::trainer {
namespace {

// Layer l's compact state regions: arbitrary bytes of a size that is not a multiple of 4.
std::vector<uint8_t> Region(int l, int which) {
  std::vector<uint8_t> r(1000 + 37 * l + which);
  for (size_t i = 0; i < r.size(); ++i) r[i] = static_cast<uint8_t>(i * 31 + l * 7 + which);
  return r;
}

// The fixture is per translation unit (checkpoint_testlib.h's anonymous namespace): its own name.
class CompactCheckpointTest : public CheckpointTest {};

StatusOr<CheckpointInfo> SaveCompact(const std::string& out, int64_t step, const FakeModel& m) {
  ASSIGN_OR_RETURN(CheckpointWriter w, CheckpointWriter::Begin(out, step));
  for (int l = 0; l < m.layers(); ++l) {
    const std::vector<uint8_t> mr = Region(l, 0), vr = Region(l, 1);
    LayerState ls = m.State(l);
    ls.exp_avg.clear();
    ls.exp_avg_sq.clear();
    ls.state_dtype = "int8";
    ls.exp_avg_region = mr;
    ls.exp_avg_sq_region = vr;
    RETURN_IF_ERROR(w.WriteLayer(l, ls));
  }
  TrainerState st = MakeState(step, m);
  st.state_dtype = "int8";
  return w.Commit(st);
}

TEST_F(CompactCheckpointTest, CompactStatesRoundTripInTheirOwnFormat) {
  const FakeModel m(3);
  ASSERT_TRUE(SaveCompact(out_, 5, m).ok());
  auto r = CheckpointReader::Open(Dir(5), m.fingerprint(), "int8", "fp32");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int l = 0; l < m.layers(); ++l) {
    std::vector<float> w(m.master[l].size());
    std::vector<uint8_t> mr(Region(l, 0).size()), vr(Region(l, 1).size());
    LayerTarget t{m.params[l], {w}, {}, {}};
    t.state_dtype = "int8";
    t.exp_avg_region = mr;
    t.exp_avg_sq_region = vr;
    auto step = r->ReadLayer(l, t);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, 100 + l);
    EXPECT_TRUE(SameBits(w, m.master[l])) << l;
    EXPECT_EQ(mr, Region(l, 0)) << l;
    EXPECT_EQ(vr, Region(l, 1)) << l;
  }
  // The file is a safetensors file of U8 tensors with the mode in its metadata.
  auto file = engine::SafetensorsFile::Open(Dir(5) + "/optimizer-layer-00001.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata().at("state_dtype"), "int8");
  const engine::TensorInfo* t = (*file)->Find("exp_avg_sq");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, engine::DType::kU8);
  EXPECT_EQ(t->shape, std::vector<int64_t>{static_cast<int64_t>(Region(1, 1).size())});
}

TEST_F(CompactCheckpointTest, CompactStatesAreRefusedInAnotherModeAndWhenCorrupt) {
  const FakeModel m(4);
  ASSERT_TRUE(SaveCompact(out_, 2, m).ok());
  // The run's mode is checked at Open, naming both.
  auto exact = CheckpointReader::Open(Dir(2), m.fingerprint());
  ASSERT_FALSE(exact.ok());
  EXPECT_THAT(exact.status().message(), HasSubstr("fp32 master, int8 states"));
  EXPECT_THAT(exact.status().message(), HasSubstr("exact (fp32 master, fp32 states)"));
  auto r = CheckpointReader::Open(Dir(2), m.fingerprint(), "int8", "fp32");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<float> w(m.master[0].size());
  std::vector<uint8_t> mr(Region(0, 0).size() + 1), vr(Region(0, 1).size());
  LayerTarget t{m.params[0], {w}, {}, {}};
  t.state_dtype = "int8";
  t.exp_avg_region = mr;  // one byte more than written
  t.exp_avg_sq_region = vr;
  auto wrong = r->ReadLayer(0, t);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(wrong.status().message(), HasSubstr("\"exp_avg\" is missing or not 1001 bytes"));
  t.state_dtype = "bf16";  // a target of another dtype than the file's
  mr.resize(Region(0, 0).size());
  t.exp_avg_region = mr;
  auto other = r->ReadLayer(0, t);
  ASSERT_FALSE(other.ok());
  EXPECT_THAT(other.status().message(),
              HasSubstr("holds int8 optimizer states, this run's are bf16"));
  // A flipped byte in the states fails the checksum like any file of the checkpoint.
  const std::string path = Dir(2) + "/optimizer-layer-00000.safetensors";
  auto bytes = ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() - 3] ^= 0x40;
  ASSERT_TRUE(WriteFile(path, *bytes).ok());
  t.state_dtype = "int8";
  auto corrupt = r->ReadLayer(0, t);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_THAT(corrupt.status().message(), HasSubstr("crc32c"));
}

// A bf16 master: its region (the bf16 master and its compensation) is a third U8 tensor beside the
// states, read back byte for byte; a file of another master dtype is refused naming both, and a
// writer given a bf16 master without its region (or a region without the dtype) refuses it.
TEST_F(CompactCheckpointTest, ABf16MastersRegionRoundTripsBesideTheStates) {
  const FakeModel m(2);
  {
    auto w = CheckpointWriter::Begin(out_, 3);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    for (int l = 0; l < m.layers(); ++l) {
      const std::vector<uint8_t> mr = Region(l, 0), vr = Region(l, 1), wr = Region(l, 2);
      LayerState ls = m.State(l);
      ls.exp_avg.clear();
      ls.exp_avg_sq.clear();
      ls.state_dtype = "bf16";
      ls.exp_avg_region = mr;
      ls.exp_avg_sq_region = vr;
      ls.master_dtype = "bf16";
      if (l == 0) {  // the dtype without its region, and a region without the dtype
        Status none = w->WriteLayer(l, ls);
        ASSERT_EQ(none.code(), StatusCode::kInvalidArgument) << none.ToString();
        EXPECT_THAT(none.message(), HasSubstr("master_dtype \"bf16\" with no master region"));
        ls.master_dtype = "fp32";
        ls.master_region = wr;
        Status stray = w->WriteLayer(l, ls);
        ASSERT_EQ(stray.code(), StatusCode::kInvalidArgument) << stray.ToString();
        ls.master_dtype = "bf16";
      }
      ls.master_region = wr;
      ASSERT_TRUE(w->WriteLayer(l, ls).ok()) << l;
    }
    TrainerState st = MakeState(3, m);
    st.state_dtype = "bf16";
    st.master_dtype = "bf16";
    ASSERT_TRUE(w->Commit(st).ok());
  }
  auto fp32_master = CheckpointReader::Open(Dir(3), m.fingerprint(), "bf16", "fp32");
  ASSERT_FALSE(fp32_master.ok());
  EXPECT_THAT(fp32_master.status().message(), HasSubstr("bf16 master, bf16 states"));
  EXPECT_THAT(fp32_master.status().message(), HasSubstr("fp32 master, bf16 states"));
  auto r = CheckpointReader::Open(Dir(3), m.fingerprint(), "bf16", "bf16");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int l = 0; l < m.layers(); ++l) {
    std::vector<float> w(m.master[l].size());
    std::vector<uint8_t> mr(Region(l, 0).size()), vr(Region(l, 1).size()), wr(Region(l, 2).size());
    LayerTarget t{m.params[l], {w}, {}, {}};
    t.state_dtype = "bf16";
    t.exp_avg_region = mr;
    t.exp_avg_sq_region = vr;
    t.master_dtype = "bf16";
    t.master_region = wr;
    auto step = r->ReadLayer(l, t);
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    EXPECT_EQ(*step, 100 + l);
    EXPECT_TRUE(SameBits(w, m.master[l])) << l;
    EXPECT_EQ(mr, Region(l, 0)) << l;
    EXPECT_EQ(vr, Region(l, 1)) << l;
    EXPECT_EQ(wr, Region(l, 2)) << l;
    if (l == 1) {  // a layer file read as an fp32 master's, past Open
      t.master_dtype = "fp32";
      auto other = r->ReadLayer(l, t);
      ASSERT_FALSE(other.ok());
      EXPECT_THAT(other.status().message(), HasSubstr("holds a bf16 master, this run's is fp32"));
      t.master_dtype = "bf16";
      wr.resize(wr.size() - 1);
      t.master_region = wr;
      auto short_region = r->ReadLayer(l, t);
      ASSERT_FALSE(short_region.ok());
      EXPECT_EQ(short_region.status().code(), StatusCode::kDataLoss);
      EXPECT_THAT(short_region.status().message(), HasSubstr("the layer's bf16 master region"));
    }
  }
  auto file = engine::SafetensorsFile::Open(Dir(3) + "/optimizer-layer-00000.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ((*file)->metadata().at("master_dtype"), "bf16");
  const engine::TensorInfo* t = (*file)->Find("master");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, engine::DType::kU8);
  EXPECT_EQ(t->shape, std::vector<int64_t>{static_cast<int64_t>(Region(0, 2).size())});
}

}  // namespace
}  // namespace offloadd::trainer
