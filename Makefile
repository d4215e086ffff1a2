# One-command set-up: `make run` trains the default configuration, `make test` runs the whole suite.
# Both install everything first. GPU users: `make install TORCH_SPEC="torch==2.13.0 --index-url ..."`.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
TORCH_SPEC ?= torch==2.13.0
GRPC_VERSION := 1.85.1
PYTEST_ARGS ?=
# SKIP_FOOTBALL=1 runs the suite without building gfootball (its tests then skip with the reason).
SKIP_FOOTBALL ?=

.PHONY: install football run test test-learning test-fast test-containers image lint gpu-check clean

install: .install-stamp

# torch first and pinned: a bare `torch` requirement would pull several GB of CUDA packages.
.install-stamp: setup.py pyproject.toml protos/seed.proto Makefile launch/install_k8s_tools.sh
	$(PIP) install --quiet $(TORCH_SPEC)
	$(PIP) install --quiet setuptools wheel "grpcio-tools==$(GRPC_VERSION)"
	$(PIP) install --quiet --no-build-isolation -e ".[atari,test,video,minatar,mujoco,wandb,ray]"
	PYTHON=$(PYTHON) launch/install_k8s_tools.sh
	touch $@

# Google Research Football: apt build dependencies, then gfootball from source (~5 minutes, once).
football: install
	PYTHON=$(PYTHON) launch/install_football.sh

run: install
	launch/local.sh $(ARGS)

# The suite on TEST_WORKERS processes (pytest-xdist; a file's tests stay on one worker, the longest files first:
# tests/conftest.py). Two workers on 2 cores: 20 min here (docs/performance/cpu/test_suite.md); 3 workers were no
# faster and two tests missed their time bounds. One short learning test per agent is in it; the longer learning
# checks and the soak are in `make test-learning`.
TEST_WORKERS ?= 2
test: install $(if $(SKIP_FOOTBALL),,football)
	launch/install_test_tools.sh
	launch/install_container_tools.sh
	$(PYTHON) -m pytest -q -ra --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not learning" $(PYTEST_ARGS) tests

test-learning: install
	$(PYTHON) -m pytest -q -ra --durations=30 -m learning $(PYTEST_ARGS) tests

test-fast: install
	$(PYTHON) -m pytest -q -ra -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow and not learning" $(PYTEST_ARGS) tests

# The CPU image, built offline with podman (a local Debian base and a wheelhouse, kept between builds:
# launch/docker/offline_base.sh); IMAGE_ARGS=--online builds it from python:3.11-slim-bookworm and the indexes,
# IMAGE_ARGS="--online --engine=docker" with docker. launch/README.md section 1.
IMAGE_ARGS ?= --offline
image:
	launch/install_container_tools.sh
	launch/docker/build.sh $(IMAGE_ARGS)

# The image built offline, a learner and actors in containers (launch/README.md section 1, as written), the
# Kubernetes manifests played as pods (podman kube play), and actors following a learner that moved.
test-containers: install
	launch/install_test_tools.sh
	launch/install_container_tools.sh
	$(PYTHON) -m pytest -q -ra --durations=10 $(PYTEST_ARGS) tests/test_containers.py tests/test_moved_learner.py

# The GPU rows of the performance tables (needs one CUDA GPU and a CUDA torch): ARGS="--out_dir=DIR" etc.
gpu-check: install
	launch/gpu_check.sh $(ARGS)

lint: install
	$(PYTHON) -m ruff check .

clean:
	rm -rf .install-stamp seed/_proto build dist *.egg-info .pytest_cache
