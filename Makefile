# Two entry points, each doing its own set-up on a fresh Linux machine with Python 3.11:
#   make bench   the main job on the embedded default (generated images, tiny preset, CPU and XLA:CPU)
#   make test    what CI runs: the unit tests, the quick benchmarks (checked to have run), the gate
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CI_OUT := out/ci
export PJRT_DEVICE ?= CPU

.PHONY: venv bench test unit bench-quick gate lint asv-same asv-commits asv-publish clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

bench: $(STAMP)
	$(VENV)/bin/mrcnn-bench run --out out/bench

test: unit bench-quick gate

unit: $(STAMP)
	$(PY) -m pytest

# pytest-benchmark over the quick cases; its JSON is kept in $(CI_OUT), and the run fails unless
# every quick case listed in --expect ran (a suite that silently skips everything must not pass).
bench-quick: $(STAMP)
	mkdir -p $(CI_OUT)
	$(PY) -m pytest bench --benchmark-only --benchmark-json $(CI_OUT)/benchmarks.json -p no:cacheprovider
	$(VENV)/bin/mrcnn-bench check-benchmarks --expect torchvision/eager,static/eager,static/xla,static/train $(CI_OUT)/benchmarks.json

# The one merge gate: compile counts exactly, and the CI-sized accuracy gate.
gate: $(STAMP)
	$(VENV)/bin/mrcnn-bench gate --out $(CI_OUT)/gate.json --accuracy-out $(CI_OUT)/accuracy-ci

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# asv: the current checkout in this venv, or a range of commits in asv's own environment.
asv-same: $(STAMP)
	$(VENV)/bin/asv machine --yes
	$(VENV)/bin/asv run --python=same --set-commit-hash $$(git rev-parse HEAD) --quick --show-stderr

asv-commits: $(STAMP)
	$(VENV)/bin/asv machine --yes
	$(VENV)/bin/asv run --show-stderr $(or $(RANGE),HEAD~2..HEAD)

asv-publish: $(STAMP)
	$(VENV)/bin/asv publish

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .benchmarks .asv out
