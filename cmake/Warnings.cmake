# Strict warnings for offloadd's own targets only; third-party headers are included as SYSTEM.
function(offloadd_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow=local -Wnon-virtual-dtor
      -Wimplicit-fallthrough -Wno-unused-parameter>)
  if(OFFLOADD_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
endfunction()

# offloadd_library(NAME SOURCES ... DEPS ...) : a static library rooted at the repository
# so headers are included as "component/file.h". The include directories are build-tree only:
# the libraries the C++ SDK installs get theirs from deploy/CMakeLists.txt.
function(offloadd_library name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${A_SOURCES})
  target_include_directories(${name} PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
                                            $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/gen>)
  target_link_libraries(${name} PUBLIC ${A_DEPS} PRIVATE ${A_PRIVATE_DEPS})
  offloadd_warnings(${name})
endfunction()

function(offloadd_executable name)
  cmake_parse_arguments(A "" "" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${A_SOURCES})
  target_link_libraries(${name} PRIVATE ${A_DEPS})
  offloadd_warnings(${name})
endfunction()
