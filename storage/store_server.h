#pragma once
// StoreServer: the offloadd-store process's loop. Pops StoreOp commands from the command ring,
// turns them into TensorStore calls on arena memory, and pushes one completion per command.
// Only translation lives here; the store's behaviour is TensorStore's.
//
// Threads: Run() is the command ring's single consumer; one internal thread is the completion
// ring's single producer (TensorStore callbacks hand completions to it). Ownership: borrows the
// store, the arena and the channels' fds, which must outlive Run().

#include <cstdint>

#include "common/status.h"
#include "ipc/arena.h"
#include "ipc/ring_queue.h"
#include "storage/store_protocol.h"
#include "storage/tensor_store.h"

namespace offloadd::storage {

class StoreServer {
 public:
  StoreServer(TensorStore* store, const ipc::Arena* arena,
              ipc::Channel<ipc::CommandRecord> commands,
              ipc::Channel<ipc::CommandRecord> completions, int abort_fd)
      : store_(store),
        arena_(arena),
        commands_(commands),
        completions_(completions),
        abort_fd_(abort_fd) {}

  // Serves until kShutdown (OK) or until abort_fd fires (the daemon is gone: UNAVAILABLE).
  // In both cases every accepted command has completed (and was answered, if anyone listens)
  // before it returns.
  Status Run();

  uint64_t commands_served() const { return served_; }

 private:
  TensorStore* store_;
  const ipc::Arena* arena_;
  ipc::Channel<ipc::CommandRecord> commands_;
  ipc::Channel<ipc::CommandRecord> completions_;
  int abort_fd_;
  uint64_t served_ = 0;
};

}  // namespace offloadd::storage
