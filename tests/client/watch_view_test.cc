#include "client/offloadctl/watch_view.h"

#include <gtest/gtest.h>

#include "client/offloadctl/render.h"

namespace offloadctl {
namespace {

namespace v1 = offloadd::v1;

v1::JobEvent Progress(int64_t cursor, int64_t step, int64_t max_steps, int64_t at_seconds) {
  v1::JobEvent e;
  e.set_cursor(cursor);
  e.mutable_time()->set_seconds(at_seconds);
  auto* p = e.mutable_progress();
  p->set_step(step);
  p->set_max_steps(max_steps);
  p->set_loss(2.5);
  p->set_learning_rate(1e-4);
  p->set_tokens_per_second(900);
  return e;
}

v1::JobEvent Log(int64_t cursor, const std::string& message) {
  v1::JobEvent e;
  e.set_cursor(cursor);
  e.mutable_log()->set_message(message);
  return e;
}

v1::JobEvent State(int64_t cursor, v1::JobState state, const std::string& reason) {
  v1::JobEvent e;
  e.set_cursor(cursor);
  e.mutable_state_change()->set_state(state);
  e.mutable_state_change()->set_reason(reason);
  return e;
}

TEST(WatchViewTest, NotATerminalWritesOneLinePerEvent) {
  WatchView view(/*live=*/false, 80);
  const v1::JobEvent events[] = {State(1, v1::JOB_STATE_RUNNING, "started"),
                                 Progress(2, 1, 10, 100), Log(3, "loaded 2 shards")};
  for (const auto& e : events) EXPECT_EQ(view.OnEvent(e), RenderEvent(e));
  EXPECT_EQ(view.OnEvent(events[0]), "[1] state running started\n");
  EXPECT_EQ(view.Finish(), "");
}

TEST(WatchViewTest, TerminalRedrawsOneStatusLineAndPrintsOtherEventsAboveIt) {
  WatchView view(/*live=*/true, 120);
  EXPECT_EQ(view.OnEvent(State(1, v1::JOB_STATE_RUNNING, "started")), "[1] state running started\n")
      << "no status line yet: nothing to clear";
  const std::string first = view.OnEvent(Progress(2, 5, 10, 100));
  const std::string line =
      "step 5/10 [############............]  50%  loss 2.5000  lr 1.0e-04  900 tok/s";
  EXPECT_EQ(first, "\r" + line + "\x1b[K");
  EXPECT_EQ(view.OnEvent(Log(3, "checkpoint soon")), "\r\x1b[K[3] checkpoint soon\n" + line)
      << "the log line replaces the status line, which is drawn again below it";
  EXPECT_EQ(view.Finish(), "\n");
  EXPECT_EQ(view.Finish(), "") << "only once";
}

TEST(WatchViewTest, EtaFromTheObservedStepRateWhenTheDaemonSendsNone) {
  WatchView view(/*live=*/true, 200);
  EXPECT_EQ(view.OnEvent(Progress(1, 10, 100, 1000)).find("ETA"), std::string::npos)
      << "one point: no rate yet";
  // 10 steps in 20 s: 2 s per step, 80 steps left.
  EXPECT_NE(view.OnEvent(Progress(2, 20, 100, 1020)).find("ETA 0:02:40"), std::string::npos);
}

TEST(WatchViewTest, EtaFromStepTimeOrAsSent) {
  WatchView view(/*live=*/true, 200);
  v1::JobEvent e = Progress(1, 40, 100, 1000);
  e.mutable_progress()->mutable_step_time()->set_seconds(3);
  EXPECT_NE(view.OnEvent(e).find("ETA 0:03:00"), std::string::npos);
  e.mutable_progress()->mutable_eta()->set_seconds(7);
  EXPECT_NE(view.OnEvent(e).find("ETA 0:00:07"), std::string::npos) << "the daemon's ETA wins";
}

TEST(WatchViewTest, StatusLineFitsANarrowTerminal) {
  WatchView view(/*live=*/true, 60);
  const std::string drawn = view.OnEvent(Progress(1, 3, 10, 100));
  ASSERT_GE(drawn.size(), 4u);
  const std::string line = drawn.substr(1, drawn.size() - 4);  // between "\r" and "\x1b[K"
  EXPECT_LE(line.size(), 59u) << line;
  EXPECT_EQ(line.rfind("step 3/10 [###.......]", 0), 0u) << "narrow bar: " << line;
}

}  // namespace
}  // namespace offloadctl
