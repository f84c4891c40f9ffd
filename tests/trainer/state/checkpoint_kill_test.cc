// Checkpoints under SIGKILL: a child killed mid-write, or at spread-out instants of a whole save,
// leaves the previous checkpoint or a complete latest one.
#include "tests/trainer/state/checkpoint_testlib.h"

namespace offloadd::trainer {
namespace {

// Its own suite: gtest wants one fixture class per suite, and each file has its own.
class CheckpointKillTest : public CheckpointTest {};

// --- crashes
// --------------------------------------------------------------------------------------

// Runs `body` in a forked child; returns its pid. The child never returns into gtest.
template <typename F>
pid_t Fork(F body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    ::_exit(0);
  }
  return pid;
}

void KillAndReap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
}

TEST_F(CheckpointKillTest, KillMidWriteKeepsThePreviousCheckpoint) {
  const FakeModel old_model(1), new_model(2);
  ASSERT_TRUE(Save(out_, 10, old_model).ok());
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  const pid_t pid = Fork([&] {
    auto w = CheckpointWriter::Begin(out_, 20);
    if (!w.ok() || !w->WriteLayer(0, new_model.State(0)).ok()) ::_exit(1);
    (void)!::write(pipefd[1], "x", 1);
    ::pause();  // killed here, between two layers
  });
  char c;
  ASSERT_EQ(::read(pipefd[0], &c, 1), 1);
  KillAndReap(pid);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  EXPECT_EQ(Entries(out_).size(), 2u);  // checkpoint-10 and the dead writer's temporary

  auto latest = LatestCheckpoint(out_);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, Dir(10));
  EXPECT_EQ(Entries(out_), std::vector<std::string>{"checkpoint-10"});  // temporary removed
  ExpectHolds(Dir(10), old_model);
}

// Kills a child at spread-out instants of a whole save (write, commit, prune with
// save_total_limit 1; or a save that replaces the checkpoint of the same step). Whatever the
// instant, the latest checkpoint is complete and holds exactly one of the two states.
void KillSweep(const std::string& out, int64_t new_step) {
  const FakeModel old_model(1, 512), new_model(2, 512);
  auto save = [&] {
    if (!Save(out, new_step, new_model).ok()) ::_exit(1);
    if (!PruneCheckpoints(out, 1).ok()) ::_exit(2);
  };
  // Each child stops itself before it saves and the delays count from its SIGCONT, so that the
  // instants are spread over the save itself, not over however long a loaded machine takes to
  // schedule a fresh child: kill 0 lands before the save begins, and the last one runs it whole.
  const auto fork_stopped = [&] {
    const pid_t pid = Fork([&] {
      ::raise(SIGSTOP);
      save();
    });
    int st = 0;
    EXPECT_EQ(::waitpid(pid, &st, WUNTRACED), pid);
    EXPECT_TRUE(WIFSTOPPED(st)) << st;
    return pid;
  };
  // Time one undisturbed save to spread the kills over it.
  ASSERT_TRUE(Save(out, 10, old_model).ok());
  int status = 0;
  const pid_t timing = fork_stopped();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(timing, SIGCONT), 0);
  ASSERT_EQ(::waitpid(timing, &status, 0), timing);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const auto full = std::chrono::steady_clock::now() - t0;

  constexpr int kKills = 16;
  int saw_old = 0, saw_new = 0;
  for (int i = 0; i <= kKills; ++i) {
    ASSERT_TRUE(RemoveTree(out).ok());
    ASSERT_TRUE(Save(out, 10, old_model).ok());
    const pid_t pid = fork_stopped();
    if (i == 0) {
      KillAndReap(pid);  // before the save began
    } else if (i < kKills) {
      ASSERT_EQ(::kill(pid, SIGCONT), 0);
      std::this_thread::sleep_for(full * i / kKills);
      KillAndReap(pid);
    } else {  // the last one runs to the end
      ASSERT_EQ(::kill(pid, SIGCONT), 0);
      ASSERT_EQ(::waitpid(pid, &status, 0), pid);
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }

    auto latest = LatestCheckpoint(out);
    ASSERT_TRUE(latest.ok()) << "kill " << i << ": " << latest.status().ToString();
    auto r = CheckpointReader::Open(*latest);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::vector<float> w(new_model.master[0].size());
    ASSERT_TRUE(r->ReadLayer(0, {new_model.params[0], {w}, {}, {}}).ok());
    const bool is_new = SameBits(w, new_model.master[0]);
    EXPECT_EQ(r->state().global_step, is_new ? new_step : 10);
    ExpectHolds(*latest, is_new ? new_model : old_model);
    (is_new ? saw_new : saw_old)++;
    for (const std::string& e : Entries(out)) {
      EXPECT_NE(e[0], '.') << "kill " << i << ": " << e << " left behind";
    }
  }
  EXPECT_GT(saw_old, 0);
  EXPECT_GT(saw_new, 0);
}

TEST_F(CheckpointKillTest, KillAtAnyInstantOfASaveLeavesACompleteLatest) { KillSweep(out_, 20); }

TEST_F(CheckpointKillTest, KillAtAnyInstantOfAReplacingSaveLeavesACompleteLatest) {
  KillSweep(out_, 10);
}

}  // namespace
}  // namespace offloadd::trainer
