#include "trainer/pipeline/trace.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

namespace offloadd::trainer {
namespace {

using nlohmann::json;

TraceRecorder::Options Opts(std::string process_name, size_t max_events = 1000,
                            std::string path = "", int64_t flush_every_steps = 0) {
  TraceRecorder::Options o;
  o.process_name = std::move(process_name);
  o.max_events = max_events;
  o.path = std::move(path);
  o.flush_every_steps = flush_every_steps;
  return o;
}

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd-trace-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    for (const auto& f : Files()) ::unlink((dir_ + "/" + f).c_str());
    ::rmdir(dir_.c_str());
  }
  std::vector<std::string> Files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (std::string n = e->d_name; n != "." && n != "..") out.push_back(n);
      }
      ::closedir(d);
    }
    return out;
  }
  json Write(const TraceRecorder& r) {
    const std::string path = dir_ + "/trace.json";
    Status st = r.WriteJson(path);
    EXPECT_TRUE(st.ok()) << st.ToString();
    std::ifstream in(path);
    return json::parse(in);  // throws (fails the test) on malformed JSON
  }
  static std::vector<json> Complete(const json& trace) {
    std::vector<json> out;
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] == "X") out.push_back(e);
    }
    return out;
  }
  // tid -> track name, from the thread_name metadata events.
  static std::map<int, std::string> Tracks(const json& trace) {
    std::map<int, std::string> out;
    for (const auto& e : trace["traceEvents"]) {
      if (e["ph"] == "M" && e["name"] == "thread_name") out[e["tid"]] = e["args"]["name"];
    }
    return out;
  }
  std::string dir_;
};

TEST_F(TraceTest, NamesProcessAndStandardTracks) {
  TraceRecorder r(Opts("job-42"));
  const json t = Write(r);
  EXPECT_EQ(t["displayTimeUnit"], "ms");
  EXPECT_TRUE(Complete(t).empty());
  bool process_named = false;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      process_named = e["args"]["name"] == "job-42";
    }
  }
  EXPECT_TRUE(process_named);
  std::set<std::string> names;
  for (const auto& [tid, name] : Tracks(t)) names.insert(name);
  EXPECT_EQ(names, (std::set<std::string>{"step", "gpu compute", "h2d", "d2h", "cpu update",
                                          "nvme read", "nvme write"}));
}

TEST_F(TraceTest, SpansAreCompleteOrderedAndOnTheirTracks) {
  TraceRecorder r;
  r.AddSpan(tracks::kGpuCompute, "backward L1", 500, 800, {{"layer", 1}, {"kind", "bwd"}});
  r.AddSpan(tracks::kStep, "step 1", 0, 1000, {{"loss", 2.5}});
  r.AddSpan(tracks::kH2D, "weights L0", 100, 150, {{"bytes", uint64_t{1} << 40}});
  r.AddSpan(tracks::kGpuCompute, "forward L0", 150, 400);
  r.AddSpan("cpu update 3", "adamw L1", 900, 850);  // ends before it starts: zero duration
  {
    ScopedSpan s(&r, tracks::kCpuUpdate, "scoped");
    s.AddArg({"ok", true});
  }
  ScopedSpan off(nullptr, tracks::kCpuUpdate, "not recorded");

  const json t = Write(r);
  const auto tracks_by_tid = Tracks(t);
  const auto spans = Complete(t);
  ASSERT_EQ(spans.size(), 6u);
  std::map<std::string, json> by_name;
  int64_t last_ts = -1;
  for (const auto& s : spans) {
    for (const char* key : {"pid", "tid", "ts", "dur", "name"}) ASSERT_TRUE(s.contains(key)) << s;
    EXPECT_GE(s["ts"].get<int64_t>(), last_ts) << "spans sorted by start";
    last_ts = s["ts"];
    EXPECT_GE(s["dur"].get<int64_t>(), 0);
    ASSERT_TRUE(tracks_by_tid.count(s["tid"])) << "span on an unnamed track: " << s;
    by_name[s["name"]] = s;
  }
  EXPECT_EQ(spans.front()["name"], "step 1");
  EXPECT_EQ(tracks_by_tid.at(by_name["step 1"]["tid"]), "step");
  EXPECT_EQ(by_name["step 1"]["dur"], 1000);
  EXPECT_EQ(by_name["step 1"]["args"]["loss"], 2.5);
  EXPECT_EQ(tracks_by_tid.at(by_name["weights L0"]["tid"]), "h2d");
  EXPECT_EQ(by_name["weights L0"]["args"]["bytes"], uint64_t{1} << 40);
  EXPECT_EQ(by_name["backward L1"]["args"]["layer"], 1);
  EXPECT_EQ(by_name["backward L1"]["args"]["kind"], "bwd");
  EXPECT_EQ(tracks_by_tid.at(by_name["adamw L1"]["tid"]), "cpu update 3");
  EXPECT_EQ(by_name["adamw L1"]["dur"], 0);
  EXPECT_EQ(tracks_by_tid.at(by_name["scoped"]["tid"]), "cpu update");
  EXPECT_EQ(by_name["scoped"]["args"]["ok"], true);
  EXPECT_GE(by_name["scoped"]["ts"].get<int64_t>(), 0);
}

TEST_F(TraceTest, EscapesNamesAndNonFiniteArgs) {
  TraceRecorder r(Opts("a \"quoted\"\njob"));
  r.AddSpan("track\\x", std::string("bad \xff utf8 \x01"), 1, 2,
            {{"nan", std::nan("")}, {"s", "tab\there"}});
  const json t = Write(r);
  const auto spans = Complete(t);
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_TRUE(spans[0]["args"]["nan"].is_null());
  EXPECT_EQ(spans[0]["args"]["s"], "tab\there");
  EXPECT_EQ(Tracks(t).at(spans[0]["tid"]), "track\\x");
}

TEST_F(TraceTest, ConcurrentWritersLoseNothing) {
  constexpr int kThreads = 8, kSpans = 2000;
  TraceRecorder r;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&r, i] {
      const std::string own = "worker " + std::to_string(i);
      for (int j = 0; j < kSpans; ++j) {
        const int64_t now = NowMicros();
        r.AddSpan(j % 2 ? own : std::string(tracks::kCpuUpdate), "s", now, now + 1,
                  {{"thread", i}, {"i", j}});
        if (j % 500 == 0) ScopedSpan s(&r, own, "scoped");
      }
    });
  }
  // Writing while spans are being added is safe and yields valid JSON.
  for (int k = 0; k < 5; ++k) Write(r);
  for (auto& t : threads) t.join();

  const json t = Write(r);
  EXPECT_EQ(r.dropped(), 0u);
  const auto spans = Complete(t);
  EXPECT_EQ(spans.size(), size_t{kThreads} * (kSpans + kSpans / 500));
  std::map<int, std::set<int>> seen;
  for (const auto& s : spans) {
    if (s["name"] == "s") seen[s["args"]["thread"]].insert(s["args"]["i"].get<int>());
  }
  ASSERT_EQ(seen.size(), size_t{kThreads});
  for (const auto& [thread, is] : seen) EXPECT_EQ(is.size(), size_t{kSpans}) << thread;
  EXPECT_EQ(Tracks(t).size(), 7u + kThreads);
}

TEST_F(TraceTest, MemoryBoundDropsAndCounts) {
  TraceRecorder r(Opts("bounded", 10));
  for (int i = 0; i < 25; ++i) r.AddSpan(tracks::kNvmeRead, "read", i, i + 1);
  EXPECT_EQ(r.size(), 10u);
  EXPECT_EQ(r.dropped(), 15u);
  const json t = Write(r);
  EXPECT_EQ(Complete(t).size(), 10u);
  EXPECT_EQ(t["otherData"]["dropped_events"], 15);
  EXPECT_EQ(t["otherData"]["max_events"], 10);
}

TEST_F(TraceTest, FlushesEveryNStepsAtomically) {
  const std::string path = dir_ + "/flush.json";
  TraceRecorder r(Opts("flush", 1000, path, 2));
  r.AddSpan(tracks::kStep, "step 1", 0, 10);
  ASSERT_TRUE(r.StepFinished(1).ok());
  EXPECT_TRUE(Files().empty());
  r.AddSpan(tracks::kStep, "step 2", 10, 20);
  ASSERT_TRUE(r.StepFinished(2).ok());
  // Only the final file: the temporary was renamed over it.
  EXPECT_EQ(Files(), std::vector<std::string>{"flush.json"});
  std::ifstream in(path);
  EXPECT_EQ(Complete(json::parse(in)).size(), 2u);
}

TEST_F(TraceTest, UnwritablePathIsAnErrorNamingIt) {
  TraceRecorder r;
  const Status st = r.WriteJson(dir_ + "/missing/trace.json");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_NE(st.message().find("missing/trace.json"), std::string::npos) << st.ToString();
}

// The temporary file was opened by absolute path, following symlinks and
// truncating what they pointed at. Symlinks planted at every name it used (<path>.tmp.<pid>.<n>)
// and at the trace itself: the victim is untouched, the trace is a new regular file.
TEST_F(TraceTest, PlantedSymlinksAreNeverWrittenThrough) {
  const std::string victim = dir_ + "/victim";
  std::ofstream(victim) << "victim";
  const std::string path = dir_ + "/trace.json";
  for (int n = 0; n < 64; ++n) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(n);
    ASSERT_EQ(::symlink(victim.c_str(), tmp.c_str()), 0);
  }
  ASSERT_EQ(::symlink(victim.c_str(), path.c_str()), 0);
  TraceRecorder r(Opts("planted"));
  r.AddSpan(tracks::kStep, "step 1", 0, 10);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r.WriteJson(path).ok());
  std::ifstream in(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "victim");
  struct stat st {};
  ASSERT_EQ(::lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  std::ifstream trace(path);
  EXPECT_EQ(Complete(json::parse(trace)).size(), 1u);
}

TEST(NowMicrosTest, IsMonotonicFromOneEpoch) {
  const int64_t a = NowMicros();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const int64_t b = NowMicros();
  EXPECT_GE(a, 0);
  EXPECT_GE(b - a, 2000);
}

}  // namespace
}  // namespace offloadd::trainer
