# One-command set-up: `make run` trains the default configuration, `make test` runs the whole suite.
# Both install everything first. GPU users: `make install TORCH_SPEC="torch==2.13.0 --index-url ..."`.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_SPEC ?= torch==2.13.0
GRPC_VERSION := 1.85.1
PYTEST_ARGS ?=

.PHONY: install run test lint clean

install: .install-stamp

# torch first and pinned: a bare `torch` requirement would pull several GB of CUDA packages.
.install-stamp: setup.py pyproject.toml protos/seed.proto Makefile
	$(PIP) install --quiet $(TORCH_SPEC)
	$(PIP) install --quiet setuptools wheel "grpcio-tools==$(GRPC_VERSION)"
	$(PIP) install --quiet --no-build-isolation -e ".[atari,test]"
	touch $@

run: install
	launch/local.sh $(ARGS)

test: install
	$(PYTHON) -m pytest -q -ra $(PYTEST_ARGS) tests

lint: install
	$(PYTHON) -m ruff check .

clean:
	rm -rf .install-stamp seed/_proto build *.egg-info .pytest_cache
