#!/usr/bin/env bash
# The runtime's tests under ThreadSanitizer, in build-tsan/ (or $1): the flow graph with
# in-process backends (runtime_tests), the gRPC server (WorkerServerTest), the daemon's
# oneTBB pipeline (Serve*Test) and `rlsched run` with real worker processes (python.run).
#
# Debian's libtbb is not instrumented: TSan does not see the task hand-offs inside it and
# reports every message passed between two flow-graph nodes as a race. So oneTBB is
# built here from Debian's source of the installed version (apt-get source: a deb-src
# entry is added when there is none) with TBB_SANITIZE=thread, and the tests link it.
# gRPC, protobuf and Abseil stay uninstrumented: their own synchronisation is invisible
# too, so the memory functions they call are ignored (TSan's called_from_lib
# suppressions, one per library the binaries load); so is the construction of spdlog's
# logger registry, a function-local static of libspdlog whose guard TSan does not see
# when the first log line comes from a gRPC thread. Every other access of rlsched's own
# code, and of oneTBB's, is checked. The first report fails the test (halt_on_error).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-tsan}
tbb=$PWD/$build/onetbb
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

version=$(dpkg-query -W -f='${source:Version}' libtbb-dev)
# Built again when the installed libtbb-dev is another version than the one built.
if [ "$(cat "$tbb/debian-version" 2>/dev/null)" != "$version" ]; then
  if ! dpkg-query -W -f='${Status}' dpkg-dev 2>/dev/null | grep -q "install ok installed"; then
    $sudo apt-get install -y -qq --no-install-recommends dpkg-dev >&2
  fi
  if ! apt-cache showsrc onetbb 2>/dev/null | grep -q "^Version: $version\$"; then
    # The binary sources again as source sources (deb822 or one-line format).
    list=$(mktemp)
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] && sed 's/^Types:.*/Types: deb-src/' "$f" >>"$list" && echo >>"$list"
    done
    if [ -s "$list" ]; then
      $sudo cp "$list" /etc/apt/sources.list.d/rlsched-deb-src.sources
    else
      grep -h '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        sed 's/^deb /deb-src /' >"$list"
      $sudo cp "$list" /etc/apt/sources.list.d/rlsched-deb-src.list
    fi
    rm -f "$list"
    $sudo chmod 644 /etc/apt/sources.list.d/rlsched-deb-src.*
    $sudo apt-get update -qq
  fi
  rm -rf "$build/onetbb-source" && mkdir -p "$build/onetbb-source"
  (cd "$build/onetbb-source" && apt-get source -qq "onetbb=$version" >/dev/null)
  source_dir=$(find "$build/onetbb-source" -mindepth 1 -maxdepth 1 -type d | head -n 1)
  rm -rf "$build/onetbb-build"
  cmake -S "$source_dir" -B "$build/onetbb-build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTBB_SANITIZE=thread -DTBB_TEST=OFF -DTBB_EXAMPLES=OFF -DTBBMALLOC_BUILD=OFF \
    -DTBB_STRICT=OFF -DCMAKE_INSTALL_PREFIX="$tbb" >/dev/null
  cmake --build "$build/onetbb-build" -j2
  rm -rf "$tbb"
  cmake --install "$build/onetbb-build" >/dev/null
  echo "$version" >"$tbb/debian-version"
fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRLSCHED_SANITIZERS=thread \
  -DRLSCHED_BUILD_BENCHMARKS=OFF -DRLSCHED_WERROR=ON -DTBB_DIR="$tbb/lib/cmake/TBB"
cmake --build "$build" -j2 --target runtime_tests app_tests rlsched rlsched_proto_python

suppressions=$PWD/$build/tsan_suppressions.txt
for binary in "$build/rlsched" "$build/tests/app/app_tests" "$build/tests/scheduler/runtime_tests"; do
  ldd "$binary" | awk '{print $1}'
done | grep -E '^lib(grpc|gpr|upb|protobuf|absl|address_sorting|re2|cares|ssl|crypto|z\.)' |
  sort -u | sed 's/^/called_from_lib:/' >"$suppressions"
echo 'race:spdlog::details::registry::registry' >>"$suppressions"

# Not the two byte-stream sweeps of ServeCliTest: hundreds of short-lived processes,
# slow under TSan, and parsing rather than threads (the ASan build and the fuzzer run them).
TSAN_OPTIONS="suppressions=$suppressions halt_on_error=1 second_deadlock_stack=1" \
  ctest --test-dir "$build" --output-on-failure -j2 \
  -R '^(RuntimeTest|WeightSyncTest|WorkerServerTest|ServeTest|ServeCliTest|ReshardServeTest|SimulateServeTest)\.|^python\.run$' \
  -E 'RandomByteStreams|TruncatedValidStreams'
