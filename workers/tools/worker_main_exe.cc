// offloadd-worker: one CPU optimizer process of the daemon's WorkerPool. See workers/worker_main.h.
#include "workers/worker_main.h"

int main(int argc, char** argv) { return offloadd::workers::WorkerMain(argc, argv); }
