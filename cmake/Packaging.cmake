# CPack: the Debian package of what deploy/CMakeLists.txt installs, with prefix /usr.
#   scripts/package.sh                    # setup, configure, build what is installed, then:
#   cpack -G DEB -B build/package         # from the build tree: build/package/offloadd_<v>_<arch>.deb
# Depends comes from dpkg-shlibdeps over every ELF file in the package (the programs and the
# bundled LibTorch), so it names exactly the Debian libraries they link (gRPC, protobuf, yaml-cpp,
# liburing, prometheus-cpp, ...); tests/python/packaging checks the ones that matter.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME offloadd)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "offloadd")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(OFFLOADD_PACKAGE_MAINTAINER "offloadd maintainers <offloadd@localhost>" CACHE STRING
    "Maintainer field of the Debian package")
set(CPACK_PACKAGE_CONTACT "${OFFLOADD_PACKAGE_MAINTAINER}")
if(OFFLOADD_WITH_CUDA)
  set(_flavour CUDA)
else()
  set(_flavour CPU)
endif()
set(CPACK_PACKAGE_DESCRIPTION
    "offloadd fine-tunes language models larger than one GPU's memory: fp32 master weights and\n\
Adam states live in CPU RAM or on NVMe, bf16 weights stream to the GPU layer by layer and CPU\n\
optimizer workers update each layer as soon as its backward ends. It runs as the systemd service\n\
offloadd.service; jobs are submitted with offloadctl, the C++ SDK (find_package(offloadd)) or the\n\
Python SDK (the wheel in /usr/share/offloadd/python). LibTorch's runtime libraries (${_flavour}\n\
flavour, torch ${OFFLOADD_TORCH_VERSION}) are bundled under /usr/lib/offloadd.")

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # offloadd_<version>_<arch>.deb
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
if(OFFLOADD_WITH_CUDA)
  # Bundled CUDA libraries (torch's NVRTC shim, ...) link the driver's libcuda.so.1, which the host
  # provides with its GPU driver, from Debian's nvidia packages or NVIDIA's installer: no package
  # can be named for it. The toolkit's stub under that soname lets dpkg-shlibdeps resolve it
  # without adding a dependency (CPack runs it with --ignore-missing-info).
  set(_stubs ${PROJECT_BINARY_DIR}/deploy/shlibdeps-stubs)
  file(MAKE_DIRECTORY ${_stubs})
  file(CREATE_LINK ${CUDAToolkit_LIBRARY_DIR}/stubs/libcuda.so ${_stubs}/libcuda.so.1 SYMBOLIC)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${_stubs})
endif()
# The unit, sysusers.d and tmpfiles.d files need systemd; the C++ SDK needs the development
# packages of what its headers include; the Python wheel installs with pip into a virtualenv.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS
    "libgrpc++-dev, libprotobuf-dev, libyaml-cpp-dev, cmake, python3-venv, prometheus, grafana")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${PROJECT_SOURCE_DIR}/deploy/debian/conffiles;${PROJECT_SOURCE_DIR}/deploy/debian/postinst;\
${PROJECT_SOURCE_DIR}/deploy/debian/prerm;${PROJECT_SOURCE_DIR}/deploy/debian/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
# LibTorch is hundreds of MB (GBs for the CUDA flavour): zstd on all cores takes seconds where
# gzip takes minutes. dpkg reads zstd since Debian 12 and Ubuntu 21.10.
set(CPACK_DEBIAN_COMPRESSION_TYPE zstd)
set(CPACK_THREADS 0)
# Strips offloadd's own programs (built RelWithDebInfo); the bundled libraries are left as shipped.
set(CPACK_STRIP_FILES ON)

include(CPack)
