# The two commands: `make demo` and `make test`. Both set up a fresh Debian machine themselves.
JOBS ?= $(shell nproc)

.PHONY: setup build demo test fuzz python-test clean

setup:
	./scripts/setup.sh

build: setup
	cmake --preset release
	cmake --build --preset release -j $(JOBS)

demo: build
	./build/release/tools/flashtq/flashtq demo

test: build
	./scripts/test.sh

# The libFuzzer harnesses (tests/fuzz/) for FUZZ_SECONDS each (`make test` runs them for 60 s).
FUZZ_SECONDS ?= 600
fuzz: setup
	./scripts/fuzz.sh $(FUZZ_SECONDS)

# The Python package alone (its own venv, pinned wheels, pip install ., pytest); `make test` runs it too.
python-test: setup
	./scripts/python_test.sh

clean:
	rm -rf build
