# The wire library and the Python module's decision core configure without the program's
# packages: CMake with RLSCHED_BUILD_PROGRAM=OFF and RLSCHED_BUILD_WIRE=ON (what
# `pip install` does) must not look for gRPC, oneTBB, spdlog or CLI11 (nlohmann-json is
# the resharding planner's, for Hugging Face configs), and
# must still put the wire bindings into rlsched_native.
# Usage: cmake -DSOURCE=<repo> -DBINARY=<scratch dir> -P wire_alone.cmake
file(REMOVE_RECURSE "${BINARY}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE}" -B "${BINARY}" -G Ninja
          -DRLSCHED_BUILD_PROGRAM=OFF -DRLSCHED_BUILD_WIRE=ON -DRLSCHED_BUILD_PYTHON=ON
          -DRLSCHED_BUILD_TESTS=OFF -DRLSCHED_BUILD_BENCHMARKS=OFF
          -DCMAKE_DISABLE_FIND_PACKAGE_gRPC=ON -DCMAKE_DISABLE_FIND_PACKAGE_TBB=ON
          -DCMAKE_DISABLE_FIND_PACKAGE_spdlog=ON -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON
          # one rule per source file, so that build.ninja names each file it compiles
          -DCMAKE_UNITY_BUILD=OFF
  RESULT_VARIABLE status OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "configuring the wire library alone failed (${status}):\n${out}\n${err}")
endif()
file(READ "${BINARY}/build.ninja" ninja)
foreach(needed "wire_bindings.cc" "orchestrator_convert.cc" "orchestrator.pb.cc")
  string(FIND "${ninja}" "${needed}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the wire-only build does not compile ${needed}")
  endif()
endforeach()
foreach(absent "worker_server.cc" "runtime.grpc.pb.cc" "runtime.cc")
  string(FIND "${ninja}" "/${absent}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "the wire-only build compiles ${absent}, a part of the program")
  endif()
endforeach()
file(REMOVE_RECURSE "${BINARY}")
message(STATUS "the wire library configures alone")
