#pragma once
// The body of the offloadd-worker executable: receive the hello and fds on the control socket,
// attach the arena, finish interrupted chunk commits, then pop commands / execute / push
// completions until the daemon says kShutdown or goes away (control socket hang-up;
// PR_SET_PDEATHSIG also kills us if the daemon dies).
//
//   offloadd-worker --control-fd=N   (the pool passes N=3)

namespace offloadd::workers {

int WorkerMain(int argc, char** argv);

}  // namespace offloadd::workers
