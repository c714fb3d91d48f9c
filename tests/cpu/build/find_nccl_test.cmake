# cmake -DMODULE_DIR=<repo>/cmake -DWORK_DIR=<dir> -P find_nccl_test.cmake
# Each case configures a project whose only step is find_package(NCCL 2.28.9) against made-up installs
# (nccl.h's version defines, nccl_device.h or not, lib/libnccl.so) and checks which one FindNCCL took, or
# that it failed naming what it saw. python3's nvidia.nccl is a package on a PYTHONPATH that a wrapper
# around the real interpreter (run with -S, so that no installed wheel answers) sets: one directory as
# run, another under -I, as pip's build isolation shows the environment's own packages only to `python -I`.
cmake_minimum_required(VERSION 3.25)
find_program(PYTHON NAMES python3 REQUIRED)
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(failures 0)

# An install at <dir> of version v; device: whether it has nccl_device.h.
function(make_nccl dir v device)
  string(REPLACE "." ";" parts "${v}")
  list(GET parts 0 maj)
  list(GET parts 1 min)
  list(GET parts 2 pat)
  file(WRITE "${dir}/include/nccl.h" "#define NCCL_MAJOR ${maj}\n#define NCCL_MINOR ${min}\n#define NCCL_PATCH ${pat}\n")
  if(device)
    file(WRITE "${dir}/include/nccl_device.h" "")
  endif()
  file(WRITE "${dir}/lib/libnccl.so" "")
endfunction()

make_nccl("${WORK_DIR}/old" 2.28.3 ON)
make_nccl("${WORK_DIR}/new" 2.28.9 ON)
make_nccl("${WORK_DIR}/newer" 2.29.1 ON)
make_nccl("${WORK_DIR}/nodevice" 2.30.0 OFF)
# python3's nvidia.nccl: a namespace package nvidia holding nccl (its __path__[0] is the install).
make_nccl("${WORK_DIR}/py/visible/nvidia/nccl" 2.28.9 ON)
file(WRITE "${WORK_DIR}/py/visible/nvidia/nccl/__init__.py" "")
make_nccl("${WORK_DIR}/py/isolated/nvidia/nccl" 2.28.10 ON)
file(WRITE "${WORK_DIR}/py/isolated/nvidia/nccl/__init__.py" "")
file(MAKE_DIRECTORY "${WORK_DIR}/py/none")

# A python3 whose nvidia.nccl is `normal` (a directory under py/) as run and `isolated` under -I.
function(make_python name normal isolated)
  set(p "${WORK_DIR}/${name}")
  file(WRITE "${p}" "#!/bin/sh\nif [ \"$1\" = -I ]; then shift; PYTHONPATH='${WORK_DIR}/py/${isolated}' exec '${PYTHON}' -S \"$@\"; fi\n"
                    "PYTHONPATH='${WORK_DIR}/py/${normal}' exec '${PYTHON}' -S \"$@\"\n")
  file(CHMOD "${p}" PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
endfunction()
make_python(python-none none none)
make_python(python-visible visible none)
make_python(python-isolated none isolated)

file(WRITE "${WORK_DIR}/project/CMakeLists.txt" "
cmake_minimum_required(VERSION 3.25)
project(find_nccl_case NONE)
list(APPEND CMAKE_MODULE_PATH \"${MODULE_DIR}\")
find_package(NCCL 2.28.9 REQUIRED)
message(STATUS \"chosen: \${NCCL_INCLUDE_DIR}\")
")

# Configures the project with NCCL_HOME=home (\"\" for none) and the given -D arguments; expect: the install
# (a directory under WORK_DIR) it must choose, or FAIL and regexes its output must hold.
function(check name home expect)
  set(build "${WORK_DIR}/build-${name}")
  file(REMOVE_RECURSE "${build}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env --unset=NCCL_HOME "NCCL_HOME=${home}"
                          ${CMAKE_COMMAND} -S "${WORK_DIR}/project" -B "${build}" -DNCCL_SYSTEM_PREFIXES= ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REPLACE "\n" " " text "${out} ${err}")
  string(REGEX REPLACE " +" " " text "${text}")
  if(expect STREQUAL "FAIL")
    if(rc EQUAL 0)
      message(SEND_ERROR "${name}: configured, expected a failure: ${text}")
      math(EXPR failures "${failures} + 1")
    endif()
    foreach(pattern IN LISTS FAIL_TEXT)
      if(NOT text MATCHES "${pattern}")
        message(SEND_ERROR "${name}: the error lacks '${pattern}': ${text}")
        math(EXPR failures "${failures} + 1")
      endif()
    endforeach()
    message(STATUS "${name}: failed as expected")
  elseif(NOT rc EQUAL 0 OR NOT text MATCHES "chosen: ${WORK_DIR}/${expect}/include ")
    message(SEND_ERROR "${name}: expected ${expect} (exit ${rc}): ${text}")
    math(EXPR failures "${failures} + 1")
  else()
    message(STATUS "${name}: ${expect}")
  endif()
  set(failures ${failures} PARENT_SCOPE)
endfunction()

set(none -DPython3_EXECUTABLE=${WORK_DIR}/python-none)
# The first install new enough, in order NCCL_ROOT, NCCL_HOME, the rest; older ones and ones without the
# device header passed over.
check(root_first "${WORK_DIR}/newer" new -DNCCL_ROOT=${WORK_DIR}/new ${none})
check(too_old_root "${WORK_DIR}/new" new -DNCCL_ROOT=${WORK_DIR}/old ${none})
check(no_device_header "" newer -DNCCL_ROOT=${WORK_DIR}/nodevice "-DNCCL_SYSTEM_PREFIXES=${WORK_DIR}/newer" ${none})
# python3's wheel last, unless NCCL_PREFER_PYTHON; seen under -I when the interpreter as run does not see it.
check(wheel_last "" newer -DNCCL_ROOT=${WORK_DIR}/newer -DPython3_EXECUTABLE=${WORK_DIR}/python-visible)
check(wheel_when_older_elsewhere "" py/visible/nvidia/nccl -DNCCL_ROOT=${WORK_DIR}/old -DPython3_EXECUTABLE=${WORK_DIR}/python-visible)
check(wheel_preferred "" py/visible/nvidia/nccl -DNCCL_ROOT=${WORK_DIR}/newer -DNCCL_PREFER_PYTHON=ON
      -DPython3_EXECUTABLE=${WORK_DIR}/python-visible)
check(wheel_under_isolation "" py/isolated/nvidia/nccl -DNCCL_PREFER_PYTHON=ON -DPython3_EXECUTABLE=${WORK_DIR}/python-isolated)
# None new enough: the error names each install seen, where it looked and what to do.
set(FAIL_TEXT "2\\.28\\.3 at ${WORK_DIR}/old" "2\\.30\\.0 at ${WORK_DIR}/nodevice \\(no nccl_device\\.h\\)"
              "looked in ${WORK_DIR}/old, ${WORK_DIR}/nodevice" "Set NCCL_HOME" "nvidia-nccl-cu13")
check(none_new_enough "${WORK_DIR}/nodevice" FAIL -DNCCL_ROOT=${WORK_DIR}/old ${none})
set(FAIL_TEXT "seen: none" "Set NCCL_HOME")
check(nothing_at_all "" FAIL ${none})

if(failures GREATER 0)
  message(FATAL_ERROR "find_nccl: ${failures} case(s) failed")
endif()
message(STATUS "find_nccl: every case as expected")
