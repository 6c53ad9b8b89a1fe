#!/usr/bin/env bash
# The installed C package: `cmake --install <build> --prefix <tmp>`, then the README's
# example (<build>/readme_example.c, extracted by CMake) built against the installed tree
# with pkg-config (shared library), with CMake's find_package(llmkern) (llmkern::llmkern
# and llmkern::llmkern_static), each run. Usage: tests/install_check.sh [build-dir].
# Prints one line per check, then "N passed, N failed".
set -u
cd "$(dirname "$0")/.."
build=$(cd "${1:-build}" && pwd)
work="$build/install-check"
rm -rf "$work"; mkdir -p "$work"
prefix="$work/prefix"
pass=0; fail=0
check() { # name, command...
  local name=$1; shift
  if out=$("$@" 2>&1); then pass=$((pass + 1)); echo "$name: ok"
  else fail=$((fail + 1)); echo "$name: FAILED"; printf '%s\n' "$out" | tail -n 20; fi
}
example="$build/readme_example.c"
check "cmake --install" cmake --install "$build" --prefix "$prefix"
libdir=$(ls -d "$prefix"/lib* | head -n 1)
check "installed files" test -f "$prefix/include/llmkern.h" -a -f "$libdir/libllmkern.a" -a -e "$libdir/libllmkern.so" \
  -a -f "$libdir/pkgconfig/llmkern.pc" -a -f "$libdir/cmake/llmkern/llmkernConfig.cmake"
# pkg-config: compile flags and libraries from llmkern.pc, run with the installed library
export PKG_CONFIG_PATH="$libdir/pkgconfig"
check "pkg-config version" test "$(pkg-config --modversion llmkern)" = "$(grep -oE 'LLMKERN_VERSION_STRING "[^"]+"' include/llmkern.h | cut -d'"' -f2)"
pc_build() {
  cc -std=c11 $(pkg-config --cflags llmkern) "$example" -o "$work/example_pc" $(pkg-config --libs llmkern) \
    -Wl,-rpath,"$(pkg-config --variable=libdir llmkern)" && "$work/example_pc"
}
check "README example via pkg-config (shared)" pc_build
pc_static() {
  cc -std=c11 $(pkg-config --cflags llmkern) "$example" -o "$work/example_pc_static" \
    "$(pkg-config --variable=libdir llmkern)/libllmkern.a" $(pkg-config --libs-only-other --static llmkern) \
    -lm -lpthread -ldnnl && "$work/example_pc_static"
}
check "README example via pkg-config (static)" pc_static
# CMake: a consumer project with find_package(llmkern)
mkdir -p "$work/consumer"
cp "$example" "$work/consumer/main.c"
cat > "$work/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.18)
project(llmkern_consumer C)
find_package(llmkern 0.3 REQUIRED)
add_executable(example_shared main.c)
target_link_libraries(example_shared PRIVATE llmkern::llmkern)
add_executable(example_static main.c)
target_link_libraries(example_static PRIVATE llmkern::llmkern_static)
CM
cm_build() {
  cmake -S "$work/consumer" -B "$work/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null &&
    cmake --build "$work/consumer/build" >/dev/null
}
check "find_package(llmkern) consumer builds" cm_build
check "README example via CMake llmkern::llmkern" "$work/consumer/build/example_shared"
check "README example via CMake llmkern::llmkern_static" "$work/consumer/build/example_static"
check "static example has no libllmkern.so dependency" sh -c "! ldd '$work/consumer/build/example_static' | grep -q libllmkern"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
