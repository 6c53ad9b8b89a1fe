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

# every test: the optimised build and the sanitizer build, one grand total at the end
test: build
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLLMKERN_SANITIZE=ON -DLLMKERN_BUILD_BENCH=OFF >/dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1 ./tests/run.sh $(BUILD) $(ASAN_BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
