# Cross build for aarch64 Linux with Debian's cross toolchain (gcc-aarch64-linux-gnu,
# sysroot /usr/aarch64-linux-gnu) and its user-mode emulator (qemu-aarch64):
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DLLMKERN_ARM_DEPS=<prefix>
# LLMKERN_ARM_DEPS: a directory holding aarch64 libraries in Debian's layout
# (usr/include, usr/lib/aarch64-linux-gnu), searched beside the sysroot: oneDNN from
# scripts/install_arm_deps.sh (`make test-arm` does all of this).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
if(LLMKERN_ARM_DEPS)
  list(APPEND CMAKE_FIND_ROOT_PATH ${LLMKERN_ARM_DEPS})
endif()
# programs from the host, libraries and headers from the target roots only
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# what runs a target binary on the build machine (tests/run.sh takes it from
# LLMKERN_TEST_RUNNER; CMake uses it for try_run)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu -E LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib)
