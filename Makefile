# Two commands for a newcomer: `make demo` (the main job, offline) and `make test`.
# Both create .venv when missing and install what they need; torch is installed first,
# pinned to the local CPU build, so pip never resolves a CUDA build of its own.

PYTHON ?= python3
VENV ?= .venv
BENCH_VENV ?= .venv-bench
TORCH_VERSION ?= 2.13.0
# empty: the demo goes into the cache every rlds command uses ($RLDS_HOME, else the user cache)
DEMO_ROOT ?=
# The machine keeps its torch wheel in /opt/wheels; elsewhere pip uses the index as usual.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check $(FIND_LINKS)

.PHONY: demo test lint bench install install-test docs-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first, pinned, and only when absent.
$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) "torch==$(TORCH_VERSION)"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP) -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml $(VENV)/.torch
	$(PIP) -e ".[test]"
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

demo: install
	$(VENV)/bin/rlds demo $(if $(DEMO_ROOT),--root $(DEMO_ROOT),)

lint: install-test
	$(VENV)/bin/ruff check rlds_cli tests scripts benchmarks
	$(VENV)/bin/mypy --config-file pyproject.toml

test: install-test lint
	$(PY) -m pytest -n 2 --dist loadgroup -q

# Side-by-side benchmarks against TorchRL/Minari, in their own environment (see docs/benchmarks.md).
bench: install
	bash benchmarks/setup_env.sh $(BENCH_VENV) $(TORCH_VERSION)
	$(BENCH_VENV)/bin/python benchmarks/run_all.py --write docs/benchmarks.md

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .ruff_cache .mypy_cache build dist
