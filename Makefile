# fedlora's two commands (see README.md):
#   make run    set up, build, and run the main job
#   make test   set up, build, and run every test
# Other targets: setup, build, asan (unit tests under ASan+UBSan), bench, bench-hf (one training
# step against Hugging Face transformers + PEFT on PyPI's PyTorch, installed into .venv-bench:
# docs/benchmarks.md), bench-gpu (bench/gpu.sh on a GPU machine: the GPU tests, then the GPU
# timings into $(OUT), default build/gpu-bench.md), bench-flower (fedlora simulate against Flower's simulation of
# configs/iid.json, 3 alternating reps: about half an hour; FLOWER_ARGS="--reps 1" for one), fuzz
# (each libFuzzer harness for minutes; fuzz-ci: seconds), chaos (the SIGKILL chaos run, long), load
# (the load test), deploy-test (the Kubernetes manifests' validation, the container images, the
# compose federation and the coordinator's pod, each server killed once mid-run: docs/deploy.md),
# readme-check (README.md's shell blocks as pasted, in a scratch copy of the tree, shortened where
# the README says so: scripts/readme_blocks.py; README_ARGS=--quick leaves out the slow ones),
# live-view-check (the live view in headless chromium; the screenshot docs/images/live-view.png),
# lint (the checks that need no build: clang-format; scripts/lint.sh --fix formats).
PRESET ?= default
BUILD_DIR := build/$(PRESET)

.PHONY: run test setup setup-tests build readme-check asan bench bench-hf bench-gpu bench-flower fuzz fuzz-ci chaos load deploy-test live-view-check bazel bazel-full lint clean

run: setup build
	scripts/main_job.sh $(BUILD_DIR)

test: setup-tests build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j 2 --timeout 900

setup:
	scripts/setup.sh --all

setup-tests:
	scripts/setup.sh --tests

build:
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET)

readme-check: setup-tests build
	scripts/readme_blocks.py --build-dir $(BUILD_DIR) $(README_ARGS)

# asan and fuzz share one build: build/sanitize (clang, ASan+UBSan, libFuzzer instrumentation),
# which builds the unit tests (the ones it runs) and the fuzz harnesses, not the integration tests.
asan: setup-tests
	cmake --preset sanitize >/dev/null
	cmake --build --preset sanitize --target unit_tests fuzzers
	ctest --preset sanitize -j 2

bench: setup build
	scripts/run_benchmarks.sh $(BUILD_DIR)

bench-hf:
	scripts/setup.sh --bench
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET) --target train_step_bench decoder_step_bench
	bench/train/bench_hf_step.sh $(BUILD_DIR)

bench-gpu:
	bench/gpu.sh $(or $(OUT),build/gpu-bench.md)

bench-flower: build
	scripts/setup.sh --flower
	bench/sim/compare_flower.sh $(FLOWER_ARGS)

fuzz: setup-tests
	scripts/fuzz.sh --long

fuzz-ci: setup-tests
	scripts/fuzz.sh --short

chaos: setup build
	scripts/chaos.sh --long $(BUILD_DIR)

load: setup build
	scripts/load_test.sh $(BUILD_DIR)

# bazel: the Bazel build beside CMake (docs/bazel.md): every CPU library, fedlora, the unit tests.
bazel: setup-tests
	scripts/bazel.sh --ci

bazel-full: setup-tests
	scripts/bazel.sh --full

# The live view in headless chromium (installed by scripts/setup.sh --chromium if absent): a short
# federation, the page's DOM checked, and docs/images/live-view.png taken. Not part of CI.
live-view-check: build
	scripts/live_view_check.sh $(BUILD_DIR)

deploy-test:
	scripts/setup.sh --deploy
	scripts/deploy.sh validate
	scripts/deploy.sh test
	scripts/deploy.sh test-k8s

lint:
	scripts/setup.sh --system
	scripts/lint.sh

clean:
	rm -rf build
