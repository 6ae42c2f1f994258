# Every target creates .venv when it is missing, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# What lint and typecheck look at.
SOURCES := dcost dcost_launch.py tests experiments benchmarks notebooks docs

.PHONY: demo test test-quick experiments notebooks bench lint typecheck check floors clean docs browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@ $(VENV)/.installed

$(VENV)/.installed-docs: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python -m dcost.demo

# the whole suite: tests/, the doctests in dcost/ and the notebooks (what CI runs), in one process
# per core, at least 2 and at most 4 (pytest-xdist; a test file stays in one process, so its
# module fixtures compile once). A worker that dies of a native fault (XLA:CPU, now and then) is
# replaced, twice at most, and the test it died in runs once more (tests/crash_retry.py)
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -lt 2 ] && n=2; [ $$n -gt 4 ] && n=4; echo $$n)
PYTEST_PARALLEL ?= -n $(TEST_JOBS) --dist loadfile --max-worker-restart=2
test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_PARALLEL)

# everything but the tests marked slow and the notebooks
test-quick: $(VENV)/.installed-dev
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -m "not slow and not notebooks"

# the headless browser tests/test_browser.py drives: Debian's chromium package, installed by apt-get
# (as root) when it is missing; Playwright's own browser download is never used
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x $(CHROMIUM) ]; then echo "browser: $(CHROMIUM) is installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -q && apt-get install -y -q chromium; \
	else \
		echo "browser: $(CHROMIUM) is missing: install Debian's chromium package as root" \
			"(apt-get install chromium)"; exit 1; \
	fi

experiments: $(VENV)/.installed
	for f in experiments/[!_]*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# re-execute the notebooks and save them with their outputs (tests/test_notebooks.py runs them too)
notebooks: $(VENV)/.installed-dev
	$(BIN)/jupyter execute --inplace notebooks/*.ipynb

# the documentation site (mkdocs.yml, docs/) into site/, the API reference from the docstrings and
# the executed notebooks as they are saved (not re-run); --strict: a warning fails the build
docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/eval_throughput.py
	$(BIN)/python benchmarks/optimizer.py
	$(BIN)/python benchmarks/plan.py
	$(BIN)/python benchmarks/calibration.py
	$(BIN)/python benchmarks/daemon.py

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)

# mypy reads its settings (files, strictness) from [tool.mypy] in pyproject.toml
typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# what CI runs, in its order
check: lint typecheck test

# The lowest versions pyproject.toml allows, installed in a venv of their own by uv's
# lowest-direct resolution (every direct dependency at its floor), on the lowest Python allowed
# when it is installed; then the quick tests, and the one test that runs jax.shard_map (slow).
FLOORS := .venv-floors
FLOORS_PYTHON ?= $(shell command -v python3.11 || echo $(PYTHON))
floors:
	rm -rf $(FLOORS)
	$(FLOORS_PYTHON) -m venv $(FLOORS)
	$(FLOORS)/bin/python -m pip install -q uv
	$(FLOORS)/bin/uv pip install -q --python $(FLOORS)/bin/python --resolution lowest-direct \
		-e ".[test]"
	$(FLOORS)/bin/python -c "import importlib.metadata as m, sys; print('python', sys.version.split()[0]); \
		[print(p, m.version(p)) for p in ('jax', 'jaxlib', 'equinox', 'optax', 'numpy', 'matplotlib', 'pytest', 'hypothesis')]"
	$(FLOORS)/bin/python -m pytest -p no:cacheprovider -m "not slow and not notebooks"
	$(FLOORS)/bin/python -m pytest -p no:cacheprovider tests/test_optimize.py::test_grid_search_shards_across_devices

clean:
	rm -rf $(VENV) $(FLOORS) build site *.egg-info
