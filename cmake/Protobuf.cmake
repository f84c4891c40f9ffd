# offloadd_proto_library(NAME PROTOS ...): C++ messages and gRPC stubs generated into
# ${PROJECT_BINARY_DIR}/gen, rooted at ${PROJECT_SOURCE_DIR}/proto.
function(offloadd_proto_library name)
  cmake_parse_arguments(A "" "" "PROTOS" ${ARGN})
  set(_root "${PROJECT_SOURCE_DIR}/proto")
  set(_out "${PROJECT_BINARY_DIR}/gen")
  file(MAKE_DIRECTORY "${_out}")
  set(_srcs)
  foreach(_p ${A_PROTOS})
    string(REGEX REPLACE "\\.proto$" "" _stem "${_p}")
    set(_gen "${_out}/${_stem}.pb.cc" "${_out}/${_stem}.pb.h"
             "${_out}/${_stem}.grpc.pb.cc" "${_out}/${_stem}.grpc.pb.h")
    add_custom_command(
      OUTPUT ${_gen}
      COMMAND protobuf::protoc --proto_path=${_root} --cpp_out=${_out} --grpc_out=${_out}
              --plugin=protoc-gen-grpc=${OFFLOADD_GRPC_CPP_PLUGIN} ${_root}/${_p}
      DEPENDS ${_root}/${_p} protobuf::protoc
      COMMENT "protoc ${_p}" VERBATIM)
    list(APPEND _srcs "${_out}/${_stem}.pb.cc" "${_out}/${_stem}.grpc.pb.cc")
  endforeach()
  add_library(${name} STATIC ${_srcs})
  target_include_directories(${name} SYSTEM PUBLIC $<BUILD_INTERFACE:${_out}>)
  target_link_libraries(${name} PUBLIC protobuf::libprotobuf gRPC::grpc++)
endfunction()
