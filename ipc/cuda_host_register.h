#pragma once
// Pins a shared segment for CUDA DMA in the GPU-owning process: cudaHostRegister(...,
// cudaHostRegisterPortable) so that every CUDA context can cudaMemcpyAsync straight to/from it,
// and cudaHostUnregister on destruction. Only built in the CUDA flavour (library
// offloadd_ipc_cuda, which defines OFFLOADD_IPC_WITH_CUDA_HOST=1).
//
//   ASSIGN_OR_RETURN(CudaHostRegistration pin, CudaHostRegistration::Register(seg.base(),
//                                                                              seg.total_size()));
//
// Ownership: the registration does not own the memory, which must stay mapped until the
// registration is destroyed. Move-only; not thread-safe to move concurrently.

#include <cstddef>

#include "common/status.h"

namespace offloadd::ipc {

class CudaHostRegistration {
 public:
  CudaHostRegistration() = default;
  CudaHostRegistration(CudaHostRegistration&& other) noexcept;
  CudaHostRegistration& operator=(CudaHostRegistration&& other) noexcept;
  CudaHostRegistration(const CudaHostRegistration&) = delete;
  CudaHostRegistration& operator=(const CudaHostRegistration&) = delete;
  ~CudaHostRegistration();

  // Errors name the CUDA error and, for out-of-memory, RLIMIT_MEMLOCK / the driver's pinning limit.
  static StatusOr<CudaHostRegistration> Register(void* base, size_t bytes);
  // Unregisters now (also done by the destructor, which can only log a failure).
  Status Unregister();

  void* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace offloadd::ipc
