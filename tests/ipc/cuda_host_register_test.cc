// GPU test (label "gpu"): pins a shared segment with cudaHostRegister(portable) and moves data
// host -> device -> host with cudaMemcpyAsync on a non-default stream. Skips without a GPU.
#include "ipc/cuda_host_register.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>

#include "ipc/arena.h"

namespace offloadd::ipc {
namespace {

TEST(CudaHostRegisterTest, SegmentRoundTripsThroughTheGpu) {
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "no CUDA device (" << cudaGetErrorString(probe) << ")";
  }
  auto seg = SharedSegment::Create(64 << 20, {.name = "cuda-test"});
  ASSERT_TRUE(seg.ok()) << seg.status().ToString();
  auto arena = Arena::Format(&*seg);
  ASSERT_TRUE(arena.ok());
  constexpr size_t kBytes = 16 << 20;
  auto src = arena->Allocate("src", RegionKind::kParamStaging, kBytes);
  auto dst = arena->Allocate("dst", RegionKind::kGradStaging, kBytes);
  ASSERT_TRUE(src.ok() && dst.ok());
  uint32_t* in = arena->At<uint32_t>(src->offset);
  uint32_t* out = arena->At<uint32_t>(dst->offset);
  for (size_t i = 0; i < kBytes / 4; ++i) in[i] = static_cast<uint32_t>(i * 2654435761u);
  std::memset(out, 0, kBytes);

  auto pin = CudaHostRegistration::Register(seg->base(), seg->total_size());
  ASSERT_TRUE(pin.ok()) << pin.status().ToString();
  // Registering the same range twice is refused with a clear error, not a crash.
  EXPECT_EQ(CudaHostRegistration::Register(seg->base(), seg->total_size()).status().code(),
            StatusCode::kAlreadyExists);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, in), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dev, in, kBytes, cudaMemcpyHostToDevice, stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(out, dev, kBytes, cudaMemcpyDeviceToHost, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(std::memcmp(in, out, kBytes), 0);
  cudaFree(dev);
  cudaStreamDestroy(stream);
  EXPECT_TRUE(pin->Unregister().ok());
}

}  // namespace
}  // namespace offloadd::ipc
