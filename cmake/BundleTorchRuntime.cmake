# Install-time script (deploy/CMakeLists.txt runs it through install(CODE)): copies the shared
# libraries the installed programs need from the torch wheel's tree (torch/lib, nvidia/*/lib) into
# DEST, keeping their paths relative to site-packages. The wheel's own RPATHs
# ($ORIGIN/../../nvidia/cu13/lib, ...) then resolve inside DEST unchanged, and the programs'
# RUNPATH ($ORIGIN/../lib/offloadd/torch/lib) finds the first level. Everything else is a Debian
# package that the package's Depends names (dpkg-shlibdeps).
#
# Inputs:
#   OFFLOADD_BUNDLE_PROGRAMS  build-tree paths of the installed programs
#   OFFLOADD_BUNDLE_SITE      the site-packages directory that holds torch/ and nvidia/
#   OFFLOADD_BUNDLE_EXTRA     globs relative to it: libraries loaded with dlopen (cuDNN's engines,
#                             NVRTC, torch's CUDA linalg), which no NEEDED entry names
#   OFFLOADD_BUNDLE_DEST      absolute destination without DESTDIR (file(INSTALL) adds it)
set(_site "${OFFLOADD_BUNDLE_SITE}")
file(GLOB _search_dirs LIST_DIRECTORIES true "${_site}/torch/lib" "${_site}/nvidia/*/lib")
set(_extra)
foreach(_g ${OFFLOADD_BUNDLE_EXTRA})
  file(GLOB _found "${_site}/${_g}")
  list(APPEND _extra ${_found})
endforeach()

file(GET_RUNTIME_DEPENDENCIES
  EXECUTABLES ${OFFLOADD_BUNDLE_PROGRAMS}
  LIBRARIES ${_extra}
  DIRECTORIES ${_search_dirs}
  # The loader and the GPU driver's libcuda come from the host, never from a package's copy.
  PRE_EXCLUDE_REGEXES "^ld-linux" "^linux-vdso" "^libcuda\\.so" "^libnvidia-"
  RESOLVED_DEPENDENCIES_VAR _resolved
  UNRESOLVED_DEPENDENCIES_VAR _unresolved
  CONFLICTING_DEPENDENCIES_PREFIX _conflict)
if(_unresolved)
  message(FATAL_ERROR "offloadd install: cannot resolve ${_unresolved} (needed by ${OFFLOADD_BUNDLE_PROGRAMS})")
endif()
# The same soname found twice (the CUDA flavour's programs link the toolkit's libcudart, torch the
# wheel's): keep the wheel's copy, which torch was built against.
foreach(_name ${_conflict_FILENAMES})
  set(_pick)
  foreach(_candidate ${_conflict_${_name}})
    cmake_path(IS_PREFIX _site "${_candidate}" NORMALIZE _in_wheel)
    if(_in_wheel)
      set(_pick "${_candidate}")
      break()
    endif()
  endforeach()
  if(NOT _pick)
    message(FATAL_ERROR "offloadd install: ${_name} found at ${_conflict_${_name}}, none in ${_site}")
  endif()
  list(APPEND _resolved "${_pick}")
endforeach()

set(_bundle ${_extra})
foreach(_lib ${_resolved})
  cmake_path(NORMAL_PATH _lib)
  cmake_path(IS_PREFIX _site "${_lib}" NORMALIZE _in_wheel)
  if(_in_wheel)
    list(APPEND _bundle "${_lib}")
    continue()
  endif()
  # A library of the wheel's sonames resolved elsewhere only (the toolkit's libcudart under
  # /usr/local/cuda): ship the wheel's copy, which no Debian package would provide anyway.
  cmake_path(GET _lib FILENAME _name)
  foreach(_d ${_search_dirs})
    if(EXISTS "${_d}/${_name}")
      list(APPEND _bundle "${_d}/${_name}")
      break()
    endif()
  endforeach()
endforeach()
list(REMOVE_DUPLICATES _bundle)

foreach(_lib ${_bundle})
  cmake_path(NORMAL_PATH _lib)
  cmake_path(RELATIVE_PATH _lib BASE_DIRECTORY "${_site}" OUTPUT_VARIABLE _rel)
  cmake_path(GET _rel PARENT_PATH _rel_dir)
  file(INSTALL DESTINATION "${OFFLOADD_BUNDLE_DEST}/${_rel_dir}" TYPE SHARED_LIBRARY
       FOLLOW_SYMLINK_CHAIN FILES "${_lib}")
endforeach()
