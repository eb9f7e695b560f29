# The README's commands. `make train` and `make test` do all set-up on a fresh Debian 12 machine.
BUILD_DIR  ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)

.PHONY: all deps build test train bench clean

all: build

deps:
	scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	scripts/install-tokenizer-assets.sh $(BUILD_DIR)/npm >/dev/null
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j2

train: build
	LATTICE=$(BUILD_DIR)/lattice scripts/train-kjv.sh

bench: build
	scripts/install-deps.sh --bench
	LATTICE=$(BUILD_DIR)/lattice bench/compare_torch.sh

clean:
	rm -rf $(BUILD_DIR)
