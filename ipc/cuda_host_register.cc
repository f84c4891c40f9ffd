#include "ipc/cuda_host_register.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "common/logging.h"
#include "common/units.h"

namespace offloadd::ipc {

CudaHostRegistration::CudaHostRegistration(CudaHostRegistration&& other) noexcept {
  *this = std::move(other);
}

CudaHostRegistration& CudaHostRegistration::operator=(CudaHostRegistration&& other) noexcept {
  if (this != &other) {
    if (base_ != nullptr) (void)Unregister();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

CudaHostRegistration::~CudaHostRegistration() {
  if (base_ == nullptr) return;
  Status st = Unregister();
  if (!st.ok()) {
    OFFLOADD_LOG(kWarning, "ipc") << st.ToString();
  }
}

StatusOr<CudaHostRegistration> CudaHostRegistration::Register(void* base, size_t bytes) {
  if (base == nullptr || bytes == 0) return InvalidArgumentError("cudaHostRegister: empty range");
  const cudaError_t err = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls are not confused
    std::string msg = "cudaHostRegister(" + FormatByteSize(bytes) +
                      ", portable) failed: " + cudaGetErrorName(err) + ": " +
                      cudaGetErrorString(err);
    if (err == cudaErrorMemoryAllocation) {
      msg +=
          " (pinning is limited by RLIMIT_MEMLOCK and physical memory: raise the limit with "
          "LimitMEMLOCK=infinity / `ulimit -l unlimited`, or pin a smaller arena)";
      return ResourceExhaustedError(msg);
    }
    if (err == cudaErrorHostMemoryAlreadyRegistered) return AlreadyExistsError(msg);
    return InternalError(msg);
  }
  CudaHostRegistration r;
  r.base_ = base;
  r.bytes_ = bytes;
  return r;
}

Status CudaHostRegistration::Unregister() {
  if (base_ == nullptr) return OkStatus();
  void* base = std::exchange(base_, nullptr);
  bytes_ = 0;
  const cudaError_t err = cudaHostUnregister(base);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return InternalError(std::string("cudaHostUnregister failed: ") + cudaGetErrorString(err));
  }
  return OkStatus();
}

}  // namespace offloadd::ipc
