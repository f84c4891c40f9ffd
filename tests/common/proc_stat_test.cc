#include "common/proc_stat.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

namespace offloadd {
namespace {

TEST(ProcStatTest, ReadsThisProcess) {
  auto self = ReadProcStat(0);
  ASSERT_TRUE(self.has_value());
  EXPECT_GE(self->cpu_seconds, 0);
  EXPECT_GE(self->threads, 1);
  EXPECT_GT(self->resident_bytes, 0u);
  auto by_pid = ReadProcStat(::getpid());
  ASSERT_TRUE(by_pid.has_value());
  EXPECT_EQ(by_pid->start_after_boot_s, self->start_after_boot_s);
}

// A process that is gone (a killed worker or store, reaped) reads as nothing, never as an error
// or an exception: the step's runtime statistics skip it.
TEST(ProcStatTest, AGoneProcessReadsAsNothing) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  ASSERT_TRUE(ReadProcStat(child).has_value());
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_FALSE(ReadProcStat(child).has_value());
}

}  // namespace
}  // namespace offloadd
