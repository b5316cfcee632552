# Two commands for a newcomer: `make demo` (the main job, offline) and `make test`.
# Both create .venv when missing and install what they need; torch is installed first (the local
# CPU build where the machine has one) and pinned for every later install, so no resolver ever
# picks another torch. Installs use uv when the package index has it (INSTALLER=pip: pip only).

PYTHON ?= python3
VENV ?= .venv
BENCH_VENV ?= .venv-bench
TORCH_VERSION ?= 2.13.0
# empty: the demo goes into the cache every rlds command uses ($RLDS_HOME, else the user cache)
DEMO_ROOT ?=
# The machine keeps its torch wheel in /opt/wheels; elsewhere pip uses the index as usual.
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
INSTALLER ?= uv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --disable-pip-version-check $(FIND_LINKS)
# The torch the venv has, as a constraint for every install after it.
TORCH_PIN := $(VENV)/torch-pin.txt
# uv where the venv got it (the installs of `make test` take ~20 s with it, ~1 min 45 s with pip
# here), else pip. Chosen when a recipe runs ($(shell), not $(wildcard): make caches directories).
UV = $(if $(filter uv,$(INSTALLER)),$(shell test -x $(VENV)/bin/uv && echo $(VENV)/bin/uv))
INSTALL = $(if $(UV),$(UV) pip install --python $(PY) $(FIND_LINKS),$(PIP))

.PHONY: demo test lint bench install install-test docs-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# uv into the venv, from the package index; where it cannot be had, pip does the installs.
$(VENV)/.installer: | $(PY)
	$(if $(filter uv,$(INSTALLER)),$(PIP) --quiet uv || echo "uv is not available: pip installs instead")
	touch $@

# torch first, and only when absent; then pinned at the version installed.
$(VENV)/.torch: | $(VENV)/.installer
	$(PY) -c "import torch" 2>/dev/null || $(INSTALL) "torch==$(TORCH_VERSION)"
	touch $@

$(TORCH_PIN): $(VENV)/.torch
	$(PY) -c "from importlib.metadata import version; print('torch==' + version('torch'))" > $@

# the project with the extras the README walks through (record: gymnasium)
$(VENV)/.installed: pyproject.toml $(TORCH_PIN)
	$(INSTALL) --constraint $(TORCH_PIN) -e ".[record]"
	touch $@

$(VENV)/.installed-test: pyproject.toml $(TORCH_PIN)
	$(INSTALL) --constraint $(TORCH_PIN) -e ".[test,record]"
	# robomimic's SequenceDataset, compared with our robomimic reader; its pinned deps (mujoco,
	# egl_probe, ...) are not needed to read HDF5 and would not install next to our torch
	$(INSTALL) --constraint $(TORCH_PIN) --no-deps "robomimic==0.3.0"
	# bytecode of every installed module and of rlds_cli, once (~30 s): uv writes none, and where
	# PYTHONDONTWRITEBYTECODE is set no process would, so each of the suite's processes compiled
	# what it imported again (torch: 3.1 s an import instead of 1.5 s). Best effort.
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
		rlds_cli >/dev/null 2>&1 || true
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed
# the test extras, and Debian's chromium for the viewer's browser tests (tests/inspection/test_viewer_browser.py),
# best effort: where it cannot be installed (no apt, not root, offline) those tests skip
install-test: $(VENV)/.installed-test
	@command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium) \
		>/dev/null 2>&1 || echo "chromium is not installed: the viewer's browser tests will skip"

demo: install
	$(VENV)/bin/rlds demo $(if $(DEMO_ROOT),--root $(DEMO_ROOT),)

lint: install-test
	$(VENV)/bin/ruff check rlds_cli tests scripts benchmarks
	$(VENV)/bin/ruff format --check --quiet rlds_cli tests scripts benchmarks
	$(VENV)/bin/mypy --config-file pyproject.toml

test: install-test lint
	$(PY) -m pytest -n 2 --dist loadgroup -q

# Side-by-side benchmarks against TorchRL/Minari, in their own environment (see docs/benchmarks.md).
bench: install
	bash benchmarks/setup_env.sh $(BENCH_VENV) $(TORCH_VERSION)
	$(BENCH_VENV)/bin/python benchmarks/run_all.py --write docs/benchmarks.md

clean:
	rm -rf $(VENV) $(BENCH_VENV) .pytest_cache .ruff_cache .mypy_cache build dist
