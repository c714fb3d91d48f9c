# Finds NCCL with the device API (nccl_device.h), at least the version asked (find_package(NCCL <version>)),
# and defines NCCL::nccl. Candidates in order: NCCL_ROOT, $NCCL_HOME, the CUDA toolkit (NCCL in lib/, not lib64/,
# on our machines), the system's, and PyPI's nvidia-nccl-cu13 (torch's dependency: headers and library) as
# python3 sees it. The first that is new enough wins, so a host whose system NCCL is older builds against
# torch's; the error names every candidate seen and its version. NCCL_INCLUDE_DIR and NCCL_LIBRARY, when set,
# are taken as they are. NCCL_PREFER_PYTHON (pyproject.toml sets it for `pip install .`) puts the wheel first:
# the Python package runs on torch's NCCL, and the fused layer refuses an NCCL other than the one it was built
# against (src/comm/nccl_version.h).
function(_nccl_version include_dir out)
  file(STRINGS "${include_dir}/nccl.h" _lines REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*" "\\1" _maj "${_lines}")
  string(REGEX REPLACE ".*NCCL_MINOR ([0-9]+).*" "\\1" _min "${_lines}")
  string(REGEX REPLACE ".*NCCL_PATCH ([0-9]+).*" "\\1" _pat "${_lines}")
  set(${out} "${_maj}.${_min}.${_pat}" PARENT_SCOPE)
endfunction()

if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  set(_nccl_wheel "")
  if(Python3_Interpreter_FOUND)
    # As python3 runs, then in isolated mode (-I): pip's build isolation hides the environment's own
    # site-packages, torch's wheel with them, from the interpreter but not from `python -I`.
    foreach(_flag "" "-I")
      execute_process(COMMAND "${Python3_EXECUTABLE}" ${_flag} -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
                      OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      if(_nccl_wheel)
        break()
      endif()
    endforeach()
  endif()
  # NCCL_SYSTEM_PREFIXES: the fixed places, replaceable (tests/cpu/build/find_nccl_test.cmake runs without them).
  if(NOT DEFINED NCCL_SYSTEM_PREFIXES)
    set(NCCL_SYSTEM_PREFIXES /usr/local/cuda /usr)
  endif()
  set(_nccl_prefixes ${NCCL_ROOT} $ENV{NCCL_HOME} ${CUDAToolkit_LIBRARY_ROOT} ${NCCL_SYSTEM_PREFIXES} ${_nccl_wheel})
  if(NCCL_PREFER_PYTHON AND _nccl_wheel)
    list(PREPEND _nccl_prefixes "${_nccl_wheel}")
  endif()
  list(REMOVE_DUPLICATES _nccl_prefixes)
  set(_nccl_seen "")
  foreach(_prefix IN LISTS _nccl_prefixes)
    if(_prefix STREQUAL "" OR NOT EXISTS "${_prefix}/include/nccl.h")
      continue()
    endif()
    _nccl_version("${_prefix}/include" _version)
    if(NOT EXISTS "${_prefix}/include/nccl_device.h")
      list(APPEND _nccl_seen "${_version} at ${_prefix} (no nccl_device.h)")
      continue()
    endif()
    if(NCCL_FIND_VERSION AND _version VERSION_LESS NCCL_FIND_VERSION)
      list(APPEND _nccl_seen "${_version} at ${_prefix}")
      continue()
    endif()
    find_library(_nccl_lib NAMES nccl libnccl.so.2
      PATHS "${_prefix}" "${_prefix}/lib/x86_64-linux-gnu" PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH)
    set(_lib "${_nccl_lib}")
    unset(_nccl_lib CACHE)  # searched afresh at the next prefix
    if(NOT _lib)
      list(APPEND _nccl_seen "${_version} at ${_prefix} (headers without libnccl)")
      continue()
    endif()
    set(NCCL_INCLUDE_DIR "${_prefix}/include" CACHE PATH "NCCL's headers")
    set(NCCL_LIBRARY "${_lib}" CACHE FILEPATH "NCCL's library")
    break()
  endforeach()
endif()
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  _nccl_version("${NCCL_INCLUDE_DIR}" NCCL_VERSION)
endif()
set(_nccl_why "")
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  set(_nccl_seen_text "none")
  if(_nccl_seen)
    list(JOIN _nccl_seen ", " _nccl_seen_text)
  endif()
  list(FILTER _nccl_prefixes EXCLUDE REGEX "^$")
  list(JOIN _nccl_prefixes ", " _nccl_where)
  set(_nccl_why "looked in ${_nccl_where} and python3's nvidia.nccl, seen: ${_nccl_seen_text}. Set NCCL_HOME to an \
NCCL >= ${NCCL_FIND_VERSION}, or pip install nvidia-nccl-cu13 (torch's NCCL: headers and library) into python3's \
environment")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION
  REASON_FAILURE_MESSAGE "${_nccl_why}")
if(NCCL_FOUND AND NOT TARGET NCCL::nccl)
  add_library(NCCL::nccl UNKNOWN IMPORTED)
  set_target_properties(NCCL::nccl PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
