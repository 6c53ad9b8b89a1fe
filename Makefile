# llmkern top-level targets. `make run` = main job (build + benchmark/validation),
# `make test` = build + every test (plain and ASan/UBSan builds, Python binding, fuzz smoke).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
BENCH_ARGS ?=
# the sanitizer build emulates AVX-512 on an x86 CPU with AVX2 and without AVX-512
# (cmake -DLLMKERN_EMULATE_AVX512=ON, src/cpu/vec/x86_emu.h): the avx512 and avx512bf16
# rows' kernels then run, against the reference and under ASan/UBSan, on every machine
# that runs the tests; where the CPU has AVX-512 both builds run it natively
ASAN_EMULATE_AVX512 ?= $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && ! grep -qw avx512bw /proc/cpuinfo && echo ON || echo OFF)
ASAN_CMAKE = cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_SANITIZE=ON \
  -DLLMKERN_BUILD_BENCH=OFF -DLLMKERN_EMULATE_AVX512=$(ASAN_EMULATE_AVX512) >/dev/null

.PHONY: all deps build run test test-plain test-sanitize bench clean arm-deps build-arm test-arm

all: build

deps:
	@./scripts/install_deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# every SIMD ISA the CPU runs (ref alone where it has none), each row's repetitions
# interleaved between them; the share of each row's ceiling per ISA drawn into bench.png
run: build
	./$(BUILD)/llmkern_bench --isa all --plot $(BUILD)/bench.png $(BENCH_ARGS)

bench: run

test-plain: build
	./tests/run.sh $(BUILD)

test-sanitize: deps
	$(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ./tests/run.sh $(ASAN_BUILD)

# every test: the C tests of the optimised build and of the sanitizer build, the Python
# binding's pytest suite on the package as `pip install ./python` builds it (installed
# into $(BUILD)/py-install, nothing outside the build directory changes; the package ships
# this build's libllmkern.so, setup.py's LLMKERN_LIB, rather than compiling the same
# sources again: 2 minutes on 2 cores, to a byte-identical file with gcc 12; setup.py's own
# cmake build: LLMKERN_PY_INSTALL=1 scripts/test_python.sh), the installed C
# package (tests/install_check.sh: cmake --install into $(BUILD)/install-check, the README
# example built against it with pkg-config and with find_package(llmkern)), the fuzz
# smoke (fuzz-smoke below: builds the harnesses, clang-14 installed when missing, and
# runs each for FUZZ_SMOKE_TIME seconds; if clang cannot be installed or a harness fails
# to build or finds a bug, the suite fails), the aarch64 suite (test-arm below: cross
# build + every C test under qemu-aarch64, ref and neon), one grand total at the end
TEST_SUITES = python=LLMKERN_PY_INSTALL=1 LLMKERN_LIB=$(abspath $(BUILD))/libllmkern.so ./scripts/test_python.sh $(BUILD)|install=./tests/install_check.sh $(BUILD)|fuzz=$(MAKE) --no-print-directory fuzz-smoke|arm=$(MAKE) --no-print-directory test-arm
test: build
	$(ASAN_CMAKE)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 LLMKERN_EXTRA_SUITES="$(TEST_SUITES)" ./tests/run.sh $(BUILD) $(ASAN_BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(ARM_BUILD)

# ---------------------------------------------------------------- aarch64 (NEON)
# Cross build for aarch64 (cmake/aarch64-linux-gnu.cmake, -Wall -Wextra -Werror like the
# native one) and every C test binary run under user-mode emulation, each on ref and on
# neon (every test loops over the ISAs the build and CPU run); ends with the count line.
# scripts/install_arm_deps.sh installs the cross compiler and qemu-user when missing and
# unpacks oneDNN for aarch64 into $(ARM_DEPS). The guest's LD_LIBRARY_PATH points at the
# cross libc so that a multiarch libc6:arm64 under /lib/aarch64-linux-gnu (another build
# of glibc than the cross ld.so) is never mixed in. LLMKERN_TEST_EMULATED=1: the tests'
# reduced grids (tests/testutil.h, tu_emulated); OMP_WAIT_POLICY=passive: idle OpenMP
# threads sleep instead of spinning (emulated spins are slow and steal the other job's core);
# LLMKERN_EXTRA_SUITES emptied: run from `make test`'s suites, this run.sh must not start
# them again (it would recurse into test-arm).
ARM_BUILD ?= build-arm
ARM_DEPS ?= build-arm-deps
ARM_SYSROOT ?= /usr/aarch64-linux-gnu
QEMU_ARM ?= qemu-aarch64 -L $(ARM_SYSROOT) -E LD_LIBRARY_PATH=$(ARM_SYSROOT)/lib

arm-deps:
	@./scripts/install_arm_deps.sh $(ARM_DEPS) >/dev/null

build-arm: arm-deps
	cmake -S . -B $(ARM_BUILD) -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
	  -DLLMKERN_ARM_DEPS=$(abspath $(ARM_DEPS)) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(ARM_BUILD) -j $(JOBS)

test-arm: build-arm
	OMP_WAIT_POLICY=passive LLMKERN_TEST_RUNNER="$(QEMU_ARM)" LLMKERN_TEST_EMULATED=1 LLMKERN_TEST_JOBS=$(JOBS) \
	  LLMKERN_EXTRA_SUITES= ./tests/run.sh $(ARM_BUILD)

# ---------------------------------------------------------------- Python binding
.PHONY: test-python bench-torch

# the Python binding's tests (python/ on $(BUILD)/libllmkern.so); prints "N passed ..."
test-python: build
	./scripts/test_python.sh $(BUILD)

# llmkern vs PyTorch CPU on the same tensors, 2 threads each (python/bench_torch.py).
# Installs numpy and torch when missing: PyPI's Linux torch wheels are CUDA builds, so
# `pip install torch` downloads ~3 GB (torch 0.54 GB + nvidia-*/triton ~2.5 GB) and
# installs ~5 GB; the benchmark itself only uses the CPU.
bench-torch: build
	@python3 -c 'import numpy' 2>/dev/null || python3 -m pip install -q numpy || python3 -m pip install -q --break-system-packages numpy
	@python3 -c 'import torch' 2>/dev/null || python3 -m pip install torch || python3 -m pip install --break-system-packages torch
	PYTHONPATH=python LLMKERN_LIB=$(BUILD)/libllmkern.so python3 python/bench_torch.py $(BENCH_TORCH_ARGS)

# ---------------------------------------------------------------- robustness
# Fuzzing: one libFuzzer harness per operator family (fuzz/fuzz_<family>.c), built by
# fuzz/Makefile with clang-14 and -fsanitize=fuzzer,address,undefined against the library
# sources compiled with the same flags; seeds in fuzz/corpus/<family>/.
#   make fuzz FUZZ_TIME=60   every harness for FUZZ_TIME seconds (FUZZ_JOBS at once)
#   make fuzz-smoke          every harness for FUZZ_SMOKE_TIME (3) s, $(JOBS) at once: one
#                            line each, then "N passed, M failed" (part of `make test`)
#   make fuzz-emu FUZZ_TIME=60  as `make fuzz`, in $(FUZZ_EMU_BUILD), with the avx512 and
#                            avx512bf16 rows emulated on AVX2 (SIMDe): the AVX-512 kernels
#                            fuzzed on a CPU without AVX-512 (slow to build: ~7 min on 2 cores)
# clang-14, libclang-rt-14-dev and libomp-14-dev are installed when missing.
FUZZ_BUILD ?= build-fuzz
FUZZ_TIME ?= 60
FUZZ_SMOKE_TIME ?= 3
FUZZ_JOBS ?= 1
FUZZ_EMU_BUILD ?= build-fuzz-emu
TSAN_BUILD ?= build-tsan
VALGRIND_BUILD ?= build-valgrind

.PHONY: clang-deps fuzz-build fuzz fuzz-smoke fuzz-emu test-tsan test-valgrind

clang-deps:
	@./scripts/install_clang_deps.sh

fuzz-build: clang-deps
	@mkdir -p $(FUZZ_BUILD)
	@$(MAKE) --no-print-directory -f fuzz/Makefile FUZZ_BUILD=$(FUZZ_BUILD) -j $(JOBS) >$(FUZZ_BUILD)/build.log 2>&1 \
	  || (tail -n 40 $(FUZZ_BUILD)/build.log; exit 1)

fuzz: fuzz-build
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_JOBS=$(FUZZ_JOBS) ./scripts/fuzz.sh $(FUZZ_TIME)

fuzz-emu: clang-deps
	@./scripts/install_deps.sh
	@mkdir -p $(FUZZ_EMU_BUILD)
	@$(MAKE) --no-print-directory -f fuzz/Makefile FUZZ_BUILD=$(FUZZ_EMU_BUILD) FUZZ_EMULATE_AVX512=1 -j $(JOBS) \
	  >$(FUZZ_EMU_BUILD)/build.log 2>&1 || (tail -n 40 $(FUZZ_EMU_BUILD)/build.log; exit 1)
	@FUZZ_BUILD=$(FUZZ_EMU_BUILD) FUZZ_JOBS=$(FUZZ_JOBS) ./scripts/fuzz.sh $(FUZZ_TIME)

fuzz-smoke: fuzz-build
	@FUZZ_BUILD=$(FUZZ_BUILD) FUZZ_JOBS=$(JOBS) ./scripts/fuzz.sh $(FUZZ_SMOKE_TIME)

# Every test under ThreadSanitizer (+ UBSan), built with clang-14 and LLVM's OpenMP
# runtime: libgomp is not TSan-instrumented (its barriers would show as races), libomp
# with its Archer tool (OMP_TOOL_LIBRARIES) tells TSan about OpenMP's synchronisation, so
# the kernels' real OpenMP threads are checked; ignore_noninstrumented_modules keeps
# reports to instrumented code.
test-tsan: clang-deps
	CC=clang-14 cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_BUILD_BENCH=OFF \
	  "-DCMAKE_C_FLAGS=-fsanitize=thread,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" \
	  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread,undefined -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread,undefined >/dev/null
	cmake --build $(TSAN_BUILD) -j $(JOBS)
	OMP_TOOL_LIBRARIES=$$(llvm-config-14 --libdir)/libarcher.so \
	  TSAN_OPTIONS="halt_on_error=1 ignore_noninstrumented_modules=1" UBSAN_OPTIONS=print_stacktrace=1 \
	  ./tests/run.sh $(TSAN_BUILD)

# valgrind memcheck over a representative subset (scripts/valgrind.sh): every operator
# through the registry suites on small shapes, both ISAs, threads on
test-valgrind: deps
	cmake -S . -B $(VALGRIND_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_BUILD_BENCH=OFF >/dev/null
	cmake --build $(VALGRIND_BUILD) -j $(JOBS)
	./scripts/valgrind.sh $(VALGRIND_BUILD)
