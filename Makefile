# llmkern top-level targets. `make run` = main job (build + benchmark/validation),
# `make test` = build + every test (plain and ASan/UBSan builds).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
ASAN_BUILD ?= build-asan
BENCH_ARGS ?=

.PHONY: all deps build run test test-plain test-sanitize bench clean

all: build

deps:
	@./scripts/install_deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

run: build
	./$(BUILD)/llmkern_bench $(BENCH_ARGS)

bench: run

test-plain: build
	./tests/run.sh $(BUILD)

test-sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_SANITIZE=ON -DLLMKERN_BUILD_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ./tests/run.sh $(ASAN_BUILD)

# every test: the C tests of the optimised build and of the sanitizer build, the Python
# binding's pytest suite on the package as `pip install ./python` builds it (installed
# into $(BUILD)/py-install, nothing outside the build directory changes), one grand
# total at the end
TEST_SUITES = python=LLMKERN_PY_INSTALL=1 ./scripts/test_python.sh $(BUILD)
test: build
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_SANITIZE=ON -DLLMKERN_BUILD_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 LLMKERN_EXTRA_SUITES="$(TEST_SUITES)" ./tests/run.sh $(BUILD) $(ASAN_BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)

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
