# Every target creates .venv when it is missing, so a fresh clone needs nothing else.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test experiments bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-dev: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@ $(VENV)/.installed

demo: $(VENV)/.installed
	$(BIN)/python -m dcost.demo

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

experiments: $(VENV)/.installed
	for f in experiments/[!_]*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/eval_throughput.py
	$(BIN)/python benchmarks/optimizer.py

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check dcost tests experiments benchmarks

clean:
	rm -rf $(VENV) build *.egg-info
