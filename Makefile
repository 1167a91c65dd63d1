# Thin wrapper over CMake: `make run` and `make test` do all setup on a fresh machine.
BUILD    ?= build
TYPE     ?= RelWithDebInfo
SANITIZE ?=
CMAKE_ARGS ?=
JOBS     ?= $(shell nproc)
CTEST_ARGS ?=

.PHONY: all setup configure build run test test-gvisor test-tsan install clean format

all: build

setup:
	@scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(TYPE) -DWAVELET_SANITIZE=$(SANITIZE) $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The main job: wavelet-bench's demonstration (bench/wavelet/demo.sh): two CPU replicas under a
# memory limit below twice one replica's peak, ungated (out of memory) and in tick-tock.
run: build
	@bench/wavelet/demo.sh $(BUILD)

# --no-tests=error: a CTEST_ARGS selection that matches nothing fails instead of passing.
test: build
	@cd $(BUILD) && ctest --output-on-failure --no-tests=error -j $(JOBS) $(CTEST_ARGS)

# The suite inside a gVisor sandbox (runsc), as the lent GPU machines run: not part of make test.
test-gvisor: build
	@scripts/gvisor-check.sh $(BUILD)

# The concurrent suites under ThreadSanitizer, in their own build (CI runs it).
test-tsan: setup
	@scripts/tsan-check.sh build-tsan

install: build
	@cmake --install $(BUILD)

format:
	@git ls-files '*.c' '*.h' '*.cu' | xargs clang-format -i

clean:
	@rm -rf $(BUILD)
