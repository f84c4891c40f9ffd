# Locates LibTorch inside the pinned PyPI torch wheel (torch.utils.cmake_prefix_path) and decides
# the build flavour. Output:
#   offloadd::torch         imported target to link LibTorch (CPU or CUDA)
#   OFFLOADD_WITH_CUDA      ON for the CUDA flavour
#   OFFLOADD_TORCH_VERSION  e.g. 2.11.0+cu130
#
# The CPU flavour does not use TorchConfig.cmake: the PyPI wheel is CUDA-enabled and its config
# insists on a CUDA toolkit. Instead it links libtorch_cpu and libc10 directly, which is also all
# the CPU flavour needs and keeps link times down.
if(NOT OFFLOADD_PYTHON)
  if(DEFINED ENV{OFFLOADD_VENV})
    set(_venv "$ENV{OFFLOADD_VENV}")
  else()
    set(_venv "$ENV{HOME}/.cache/offloadd/venv")
  endif()
  if(EXISTS "${_venv}/bin/python")
    set(OFFLOADD_PYTHON "${_venv}/bin/python" CACHE FILEPATH "Python with torch installed")
  else()
    find_program(OFFLOADD_PYTHON NAMES python3 REQUIRED)
  endif()
endif()

execute_process(
  COMMAND "${OFFLOADD_PYTHON}" -c
    "import torch, torch.utils; print(torch.utils.cmake_prefix_path); print(torch.__version__); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_out ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "Cannot import torch with ${OFFLOADD_PYTHON}; run scripts/setup.sh "
                      "or pass -DOFFLOADD_PYTHON=<python with torch>.\n${_torch_err}")
endif()
string(REPLACE "\n" ";" _torch_out "${_torch_out}")
list(GET _torch_out 0 _torch_cmake_prefix)
list(GET _torch_out 1 OFFLOADD_TORCH_VERSION)
list(LENGTH _torch_out _n)
set(_torch_cuda "")
if(_n GREATER 2)
  list(GET _torch_out 2 _torch_cuda)
endif()
get_filename_component(OFFLOADD_TORCH_ROOT "${_torch_cmake_prefix}/../.." ABSOLUTE)

# Flavour.
set(OFFLOADD_WITH_CUDA OFF)
if(OFFLOADD_CUDA STREQUAL "ON" OR OFFLOADD_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER AND _torch_cuda)
    set(OFFLOADD_WITH_CUDA ON)
  elseif(OFFLOADD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "OFFLOADD_CUDA=ON but nvcc='${CMAKE_CUDA_COMPILER}', torch CUDA='${_torch_cuda}'")
  endif()
endif()

add_library(offloadd::torch INTERFACE IMPORTED)
if(OFFLOADD_WITH_CUDA)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)  # Hopper (H100/H200)
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  list(APPEND CMAKE_PREFIX_PATH "${_torch_cmake_prefix}")
  # torch's config reads TORCH_CUDA_ARCH_LIST; make it match ours instead of probing a GPU.
  set(TORCH_CUDA_ARCH_LIST "9.0" CACHE STRING "")
  find_package(Torch REQUIRED CONFIG)
  # TORCH_LIBRARIES carries torch's own compile flags; keep its include dirs as SYSTEM.
  target_link_libraries(offloadd::torch INTERFACE ${TORCH_LIBRARIES} CUDA::cudart)
  target_include_directories(offloadd::torch SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  target_compile_definitions(offloadd::torch INTERFACE OFFLOADD_WITH_CUDA=1)
else()
  set(_lib "${OFFLOADD_TORCH_ROOT}/lib")
  foreach(_l torch_cpu c10)
    if(NOT EXISTS "${_lib}/lib${_l}.so")
      message(FATAL_ERROR "LibTorch library ${_lib}/lib${_l}.so not found")
    endif()
  endforeach()
  target_include_directories(offloadd::torch SYSTEM INTERFACE
    "${OFFLOADD_TORCH_ROOT}/include" "${OFFLOADD_TORCH_ROOT}/include/torch/csrc/api/include")
  target_link_libraries(offloadd::torch INTERFACE "${_lib}/libtorch_cpu.so" "${_lib}/libc10.so")
  target_link_options(offloadd::torch INTERFACE "-Wl,-rpath,${_lib}")
  target_compile_definitions(offloadd::torch INTERFACE OFFLOADD_WITH_CUDA=0)
endif()
message(STATUS "LibTorch ${OFFLOADD_TORCH_VERSION} at ${OFFLOADD_TORCH_ROOT} (python ${OFFLOADD_PYTHON})")
