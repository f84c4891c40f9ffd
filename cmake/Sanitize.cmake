# Sanitizer builds of the torch-free targets.
#
#   cmake -S . -B build-asan -G Ninja -DOFFLOADD_SANITIZE=address,undefined
#   cmake -S . -B build-tsan -G Ninja -DOFFLOADD_SANITIZE=thread
#
# Every target of such a build directory is compiled and linked with -fsanitize=<value>, and its
# default target builds only the GoogleTest suites listed below (and what they need: offloadd-worker,
# offloadd-store, ...). Suites and programs that link LibTorch (the engine's model tests, the
# daemon's gRPC core, offloadd itself, offloadd-train) stay out: LibTorch is not built with a
# sanitizer, and an instrumented program that loads it reports its allocations and threads as ours.
# CTest sees only the listed suites (no python_tests), so `ctest --test-dir build-asan` runs them.
# scripts/sanitize.sh drives both builds; scripts/test.sh runs it as a separate bounded step.
set(OFFLOADD_SANITIZE "" CACHE STRING
    "Sanitizer build of the torch-free suites: address,undefined | thread (empty: a normal build)")
set_property(CACHE OFFLOADD_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")

# Torch-free suites for ASan+UBSan: every C++ suite whose binary does not link LibTorch.
set(OFFLOADD_ASAN_SUITES
    common_test safe_path_test metrics_exposer_test
    ipc_test
    text_test
    engine_format_test
    workers_test
    storage_crc32c_test storage_tensor_store_test storage_fault_test storage_process_test
    storage_format_test storage_flags_test
    trainer_test grad_scaler_test trainer_trace_test checkpoint_test
    job_validator_test train_job_config_test executor_protocol_test
    daemon_config_test daemon_jobs_test daemon_job_manager_test
    daemon_train_metrics_test daemon_openai_test
    tensorboard_writer_test torchrun_env_test trainer_state_file_test
    client_test)
# The concurrency-heavy ones for TSan: job manager, worker pool, ring queue, store.
set(OFFLOADD_TSAN_SUITES
    daemon_job_manager_test daemon_openai_test workers_test ipc_test
    storage_tensor_store_test storage_fault_test storage_process_test)

set(OFFLOADD_SANITIZE_SUITES "")
if(OFFLOADD_SANITIZE STREQUAL "")
  return()
elseif(OFFLOADD_SANITIZE STREQUAL "thread")
  set(OFFLOADD_SANITIZE_SUITES ${OFFLOADD_TSAN_SUITES})
elseif(OFFLOADD_SANITIZE MATCHES "^(address|undefined)(,(address|undefined))?$")
  set(OFFLOADD_SANITIZE_SUITES ${OFFLOADD_ASAN_SUITES})
else()
  message(FATAL_ERROR "OFFLOADD_SANITIZE: '${OFFLOADD_SANITIZE}' is not one of address,undefined | "
                      "address | undefined | thread")
endif()
if(OFFLOADD_FUZZ)
  message(FATAL_ERROR "OFFLOADD_SANITIZE and OFFLOADD_FUZZ: use separate build directories "
                      "(OFFLOADD_FUZZ already instruments everything with ASan+UBSan)")
endif()

# -fno-sanitize-recover: a UBSan finding fails the test instead of printing a line nobody reads.
# Frame pointers keep the reports' stacks whole at -O1.
set(_san_flags -fsanitize=${OFFLOADD_SANITIZE} -fno-omit-frame-pointer)
if(OFFLOADD_SANITIZE MATCHES "undefined")
  list(APPEND _san_flags -fno-sanitize-recover=undefined)
endif()
add_compile_options(${_san_flags})
add_link_options(${_san_flags})
# -O1 with debug info: the suites run several times faster than at -O0, and the reports still
# point at lines (RelWithDebInfo's -O2 inlines too much for readable TSan reports).
set(CMAKE_BUILD_TYPE Debug CACHE STRING "Build type" FORCE)
add_compile_options(-O1)
# The instrumented code is slower and larger; warnings as errors stay on (GCC's -Wmaybe-uninitialized
# at -O1 under ASan is the known false positive, so it is not an error here).
add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-Wno-error=maybe-uninitialized>)
if(OFFLOADD_SANITIZE STREQUAL "thread")
  # TSan does not model std::atomic_thread_fence (GCC's -Wtsan), which Boost.Asio's fenced blocks
  # use to publish handler state; without them Asio orders handlers through its scheduler's
  # mutex, which TSan does see.
  add_compile_definitions(BOOST_ASIO_DISABLE_FENCED_BLOCK)
endif()
message(STATUS "OFFLOADD_SANITIZE=${OFFLOADD_SANITIZE}: the default target builds ${OFFLOADD_SANITIZE_SUITES}")

# After every component is added (deferred to the end of the top-level CMakeLists.txt): every
# target leaves the default target, which then builds only the suites above (their dependencies
# come along however they are marked).
function(offloadd_sanitize_finalize)
  set(_dirs "${PROJECT_SOURCE_DIR}")
  while(_dirs)
    list(POP_FRONT _dirs _dir)
    get_property(_targets DIRECTORY "${_dir}" PROPERTY BUILDSYSTEM_TARGETS)
    foreach(_t IN LISTS _targets)
      get_target_property(_type ${_t} TYPE)
      if(NOT _type STREQUAL "INTERFACE_LIBRARY")
        set_target_properties(${_t} PROPERTIES EXCLUDE_FROM_ALL ON)
      endif()
    endforeach()
    get_property(_subdirs DIRECTORY "${_dir}" PROPERTY SUBDIRECTORIES)
    list(APPEND _dirs ${_subdirs})
  endwhile()
  add_custom_target(offloadd_sanitizer_suites ALL)
  foreach(_t IN LISTS OFFLOADD_SANITIZE_SUITES)
    if(NOT TARGET ${_t})
      message(FATAL_ERROR "OFFLOADD_SANITIZE: suite ${_t} is not defined (renamed? update cmake/Sanitize.cmake)")
    endif()
    add_dependencies(offloadd_sanitizer_suites ${_t})
  endforeach()
endfunction()
cmake_language(DEFER DIRECTORY "${PROJECT_SOURCE_DIR}" CALL offloadd_sanitize_finalize)
