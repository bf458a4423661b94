# Two entry points, each doing its own set-up on a fresh Linux machine with Python 3.11:
#   make bench   the main job on the embedded default (generated images, CPU and XLA:CPU)
#   make test    the test suite (what CI runs)
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv bench test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

bench: $(STAMP)
	PJRT_DEVICE=CPU $(PY) -m mrcnn.cli compare

test: $(STAMP)
	PJRT_DEVICE=CPU $(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .benchmarks
