# CTest script (cmake -P) behind the test consumer.find_package:
#   1. installs the build tree BUILD_DIR into WORK_DIR/prefix (cmake --install),
#   2. checks the install carries the program and the .proto files,
#   3. configures, builds and runs the project in CONSUMER_SOURCE_DIR, which does
#      find_package(rlsched) and links rlsched::balance.
# Arguments (-D): BUILD_DIR, CONSUMER_SOURCE_DIR, WORK_DIR, GENERATOR; optional
# CXX_COMPILER, CONFIG, SANITIZERS (the -fsanitize= list the library was built with),
# VERSION (checked against `rlsched --version`).
cmake_minimum_required(VERSION 3.25)

foreach(required BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR GENERATOR)
  if(NOT DEFINED ${required} OR "${${required}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer_test.cmake: -D${required}=... is required")
  endif()
endforeach()

function(run_step name)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    list(JOIN ARGN " " command)
    message(FATAL_ERROR "${name} failed (${result}):\n${command}\n${output}")
  endif()
  message(STATUS "${name}: ok")
  set(step_output "${output}" PARENT_SCOPE)
endfunction()

set(prefix "${WORK_DIR}/prefix")
set(consumer_build "${WORK_DIR}/build")
file(REMOVE_RECURSE "${WORK_DIR}")

set(config_args "")
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()

run_step("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}" ${config_args})

foreach(file bin/rlsched share/rlsched/proto/rlsched/v1/balance.proto
             include/rlsched/balance/partition.h include/rlsched/wire/solve.h
             include/rlsched/v1/service.pb.h)
  if(NOT EXISTS "${prefix}/${file}")
    message(FATAL_ERROR "the install lacks ${file} (prefix ${prefix})")
  endif()
endforeach()

run_step("installed rlsched --version" "${prefix}/bin/rlsched" --version)
if(VERSION AND NOT step_output STREQUAL "rlsched ${VERSION}\n")
  message(FATAL_ERROR "installed rlsched --version printed '${step_output}'")
endif()

set(configure_args -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}" -G "${GENERATOR}"
                   "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(CXX_COMPILER)
  list(APPEND configure_args "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
if(CONFIG)
  list(APPEND configure_args "-DCMAKE_BUILD_TYPE=${CONFIG}")
endif()
if(SANITIZERS)
  # The installed library was built with sanitizers; the consumer must link their runtimes.
  list(APPEND configure_args "-DCMAKE_CXX_FLAGS=-fsanitize=${SANITIZERS}"
       "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=${SANITIZERS}")
endif()
run_step("configure the consumer" "${CMAKE_COMMAND}" ${configure_args})

# It must have found the package just installed, not another one.
file(STRINGS "${consumer_build}/CMakeCache.txt" found_dir REGEX "^rlsched_DIR:")
string(REGEX REPLACE "^rlsched_DIR:[A-Z]+=" "" found_dir "${found_dir}")
cmake_path(IS_PREFIX prefix "${found_dir}" NORMALIZE found_in_prefix)
if(NOT found_in_prefix)
  message(FATAL_ERROR "find_package(rlsched) used ${found_dir}, not the install in ${prefix}")
endif()

run_step("build the consumer" "${CMAKE_COMMAND}" --build "${consumer_build}" ${config_args})

set(program "${consumer_build}/consumer")
if(NOT EXISTS "${program}" AND CONFIG)
  set(program "${consumer_build}/${CONFIG}/consumer")
endif()
run_step("run the consumer" "${program}")
message(STATUS "${step_output}")
