# The front door. Every target installs missing Debian packages first, so a
# fresh Debian 12 machine needs nothing but `make demo` or `make test`.
#
#   make demo            build, then move requests prefill TP 2 -> decode TP 4 through real processes
#   make test            build, then run every test not labelled `slow` or `fuzz`
#   make test-slow       the long runs (soak, benchmarks-as-tests), on demand
#   make test-sanitize   ASan + UBSan build in build-asan/, the same tests and the
#                        `fuzz` ones (five seconds a libFuzzer target, build-fuzz/)
#   make test-tsan       ThreadSanitizer build in build-tsan/, same test set
#   make fuzz            libFuzzer targets (build-fuzz/, clang) for FUZZ_RUNS executions each
#   make bench           pdkv bench --quick: every backend against its baselines, about a minute
#   make bench-full      pdkv bench over the whole grid (hours; CSV and plot in build/)
#   make bench-plan      the planner micro-benchmark
#   make gpu-check       scripts/gpu-check.sh: CUDA build, GPU tests, --device cuda runs, gpu-bench
#   make format          clang-format every C++ file

JOBS ?= 2
BUILD_TYPE ?= RelWithDebInfo
CMAKE_FLAGS ?=
CTEST = ctest --output-on-failure -j $(JOBS) --timeout 600

# LeakSanitizer suppressions (tests/lsan.supp): third-party leaks only.
SANITIZER_ENV = ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
                LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp \
                UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
# UCX's malloc and mmap hooks fight TSan's own interceptors (segfaults): off for TSan runs.
TSAN_ENV = TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp" \
           UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no

.PHONY: deps build fuzz-build fuzz demo test test-slow test-sanitize test-tsan bench bench-full bench-plan gpu-check format clean

deps:
	@scripts/install-deps.sh

# configure + build one tree: $(call build_tree,DIR,EXTRA_CMAKE_FLAGS)
# Developers and CI build with warnings as errors (PDKV_WERROR).
# Debug information is line tables only (-g1): backtraces and sanitizer
# reports keep file and line, and the build takes a third less time; set
# DEBUG_INFO=-g for variables in a debugger.
DEBUG_INFO ?= -g1
define build_tree
	cmake -S . -B $(1) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DPDKV_WERROR=ON \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 $(DEBUG_INFO) -DNDEBUG" $(CMAKE_FLAGS) $(2) >/dev/null
	cmake --build $(1) -j $(JOBS)
endef

build: deps
	$(call build_tree,build,)

# tests/fuzz: clang-14 with libFuzzer, ASan and UBSan; only the fuzz targets.
FUZZ_RUNS ?= 1000000
fuzz-build: deps
	CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Fuzz \
	  -DCMAKE_CXX_FLAGS_FUZZ="-O1 -g0" -DPDKV_SANITIZE=fuzzer -DBUILD_TESTING=OFF -DPDKV_WITH_CUDA=OFF \
	  -DPDKV_WITH_HIP=OFF -DPDKV_WERROR=ON >/dev/null
	cmake --build build-fuzz -j $(JOBS) --target pdkv_fuzz

fuzz: fuzz-build
	tests/fuzz/run.sh -runs=$(FUZZ_RUNS)

demo: build
	@echo "== which prefill rank sends which KV heads to whom (8 KV heads, TP 2 -> 4) =="
	build/bin/pdkv plan --kv-heads 8 --prefill-tp 2 --decode-tp 4
	@echo
	@echo "== a local cluster: bootstrap + 2 prefill + 4 decode processes over UCX, every byte checked =="
	build/bin/pdkv run --backend nixl --prefill-tp 2 --decode-tp 4 --kv-heads 8 --requests 32 --tokens 512

# The fault campaign (label `fault`) runs one trial per case here, which
# keeps `make test` inside CI's 20 minutes; the sanitizer run takes the
# test's default of two, `make test-slow` twenty (docs/reliability.md).
# The libFuzzer smoke runs (label `fuzz`) need the fuzz build (clang, ASan,
# three minutes here), so they run with the sanitizer run, which builds it.
test: build
	cd build && PDKV_FAULT_TRIALS=1 $(CTEST) -LE "slow|fuzz"

test-slow: build
	cd build && $(CTEST) -L slow

test-sanitize: deps fuzz-build
	$(call build_tree,build-asan,-DPDKV_SANITIZE=address)
	cd build-asan && $(SANITIZER_ENV) $(CTEST) -LE slow

test-tsan: deps
	$(call build_tree,build-tsan,-DPDKV_SANITIZE=thread)
	cd build-tsan && $(TSAN_ENV) $(CTEST) -LE slow

bench: build
	build/bin/pdkv bench --quick

bench-full: build
	build/bin/pdkv bench --csv build/bench-full.csv --plot build/bench-full.png

bench-plan: build
	build/bin/pdkv_plan_bench --benchmark_counters_tabular=true

gpu-check:
	scripts/gpu-check.sh

format:
	git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	rm -rf build build-asan build-tsan
