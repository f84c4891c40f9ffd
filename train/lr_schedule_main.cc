// offloadd-lr-schedule TYPE WARMUP_STEPS WARMUP_RATIO TOTAL_STEPS [NUM_CYCLES [MIN_LR_RATE]]:
// prints the multiplier of every optimizer update, one per line (for the parity test against
// transformers.get_scheduler).
#include <cstdio>
#include <cstdlib>

#include "trainer/lr_schedule.h"

int main(int argc, char** argv) {
  if (argc < 5 || argc > 7) {
    std::fprintf(stderr,
                 "usage: offloadd-lr-schedule TYPE WARMUP_STEPS WARMUP_RATIO TOTAL_STEPS [NUM_CYCLES [MIN_LR_RATE]]\n");
    return 2;
  }
  offloadd::trainer::LrScheduleKwargs kwargs;
  if (argc > 5) kwargs.num_cycles = std::atof(argv[5]);
  if (argc > 6) kwargs.min_lr_rate = std::atof(argv[6]);
  auto s = offloadd::trainer::LrSchedule::Create(argv[1], std::atoll(argv[2]), std::atof(argv[3]), std::atoll(argv[4]),
                                                 kwargs);
  if (!s.ok()) {
    std::fprintf(stderr, "offloadd-lr-schedule: %s\n", s.status().ToString().c_str());
    return 1;
  }
  for (int64_t k = 0; k < s->total_steps(); ++k) std::printf("%.17g\n", s->Multiplier(k));
  return 0;
}
