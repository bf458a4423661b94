# Two entry points, each doing its own set-up on a fresh Linux machine with Python 3.11:
#   make bench   the main job on the embedded default (generated images, tiny preset, CPU and XLA:CPU):
#                a stream of varied sizes and a fixed size, in one report (out/bench/index.html)
#   make test    what CI runs: the unit tests, the quick benchmarks (checked to have run), the gate,
#                and the latency check of the last change
#   make test-all  the same with the longer forms of a few unit tests (docs/testing.md)
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
BENCH := $(VENV)/bin/mrcnn-bench
STAMP := $(VENV)/.installed
# Apache Otava (the change-point method of `mrcnn-bench steps`) pins numpy and scipy below the
# harness's and brings cloud clients: it gets an environment of its own (about 25 s, 330 MB).
OTAVA_VENV := .venv-otava
OTAVA_STAMP := $(OTAVA_VENV)/.installed
CI_OUT := out/ci
export PJRT_DEVICE ?= CPU

.PHONY: venv otava-env bench test test-all unit bench-quick gate latency-check lint asv-fixture asv-scratch asv-scratch-run asv-steps-run asv-same asv-commits asv-history asv-table \
	asv-spread asv-publish asv-serve gpu-check clean

# $(call install,PYTHON,ARGS): uv installs the same pinned set in about a third of pip's time on a
# fresh machine (results/ci_time/); where uv cannot be had or fails (say, an index that only pip's own
# configuration names), pip installs it. --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE
# is set, a process would otherwise compile torch's modules from source at every start.
install = ( $(1) -m pip install -q uv && $(1) -m uv pip install --compile-bytecode --python $(1) $(2) ) || \
	{ echo "uv could not install $(2): pip installs it"; $(1) -m pip install --upgrade pip && $(1) -m pip install $(2); }

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call install,$(PY),-e '.[dev]')
	touch $(STAMP)

venv: $(STAMP)

$(OTAVA_STAMP): Makefile
	test -x $(OTAVA_VENV)/bin/python || $(PYTHON) -m venv $(OTAVA_VENV)
	$(call install,$(OTAVA_VENV)/bin/python,apache-otava==0.8.0)
	touch $(OTAVA_STAMP)

otava-env: $(OTAVA_STAMP)

# Every row over the default stream (8 sizes by a rule of the seed: mrcnn_bench.running.cases.stream_sizes),
# 16 rounds = each image timed twice; then a few rows on one fixed size; one report over both.
BENCH_FIXED_CASES := torchvision/eager,torchvision/inductor,static/eager,static/inductor
# An interrupted make bench left its rounds journaled: the same make bench resumes them.
resume_if_journal = $(if $(wildcard out/bench/$(1).rounds.jsonl),--resume)
bench: $(STAMP)
	$(BENCH) run --out out/bench --name stream_tiny --rounds 16 $(call resume_if_journal,stream_tiny)
	$(BENCH) run --out out/bench --name fixed_tiny --image-size 240x320 --cases $(BENCH_FIXED_CASES) \
		$(call resume_if_journal,fixed_tiny)
	$(BENCH) report out/bench/stream_tiny.json out/bench/fixed_tiny.json --out out/bench

# The gate's training runs on one thread for most of its time (--accuracy-threads), so it runs
# beside the unit tests, which take the rest of the machine; its output goes to $(CI_OUT)/gate.log,
# printed when both are done. Then the quick benchmarks and the latency check, alone, since they
# time. The timings of this arrangement against one after the other: results/ci_time/.
test: $(STAMP) $(OTAVA_STAMP)
	mkdir -p $(CI_OUT)
	@$(MAKE) --no-print-directory gate > $(CI_OUT)/gate.log 2>&1 & gate=$$!; \
	$(MAKE) --no-print-directory unit; unit=$$?; \
	echo "unit tests done (exit $$unit); waiting for the gate, whose log is $(CI_OUT)/gate.log"; \
	wait $$gate; gated=$$?; cat $(CI_OUT)/gate.log; \
	echo "make test: unit tests exit $$unit, gate exit $$gated"; test $$unit -eq 0 && test $$gated -eq 0
	$(MAKE) --no-print-directory bench-quick
	$(MAKE) --no-print-directory latency-check

# CI's unit tests leave out the longer forms of a few checks (`extended`: each names the CI test that
# catches the same fault more cheaply; docs/testing.md lists them); test-all runs them after make test.
# UNIT_THREADS: torch's threads in the test process (unset: up to two; one thread beside the gate
# saved nothing in one pair of runs: results/ci_time/). pytest prints its 30 slowest tests and writes
# $(CI_OUT)/junit.xml, so that CI's log shows where the time went.
unit: $(STAMP) $(OTAVA_STAMP)
	mkdir -p $(CI_OUT)
	MRCNN_TEST_THREADS=$(UNIT_THREADS) $(PY) -m pytest -m "not extended" --durations=30 --junitxml=$(CI_OUT)/junit.xml

test-all: test
	$(PY) -m pytest -m extended

# pytest-benchmark over the quick cases; its JSON is kept in $(CI_OUT), and the run fails unless
# every quick case listed in --expect ran (a suite that silently skips everything must not pass).
bench-quick: $(STAMP)
	mkdir -p $(CI_OUT)
	$(PY) -m pytest bench/pytest_suite --benchmark-only --benchmark-json $(CI_OUT)/benchmarks.json -p no:cacheprovider
	$(BENCH) check-benchmarks --expect torchvision/eager,static/eager,static/xla,static/train $(CI_OUT)/benchmarks.json

# The one merge gate: compile counts exactly, and the CI-sized accuracy gate.
gate: $(STAMP)
	$(BENCH) gate --out $(CI_OUT)/gate.json --accuracy-out $(CI_OUT)/accuracy-ci

# Is the last change slower? The working tree against the commit it starts from (HEAD's parent on
# main, else where the branch leaves main), on the cases its diff can affect, sized for five minutes;
# nothing is measured when the diff changes nothing under mrcnn/. The summary a reviewer pastes:
# $(CI_OUT)/latency-check/summary.md.
latency-check: $(STAMP)
	$(BENCH) latency-check --out $(CI_OUT)/latency-check

# Everything that needs a CUDA GPU, in one go (docs/gpu_tpu.md); exit 2 where there is none. GPU
# machines bring their own torch build, so the source tree runs with the python that has torch:
# .venv's where one was made, else python3 (pycocotools may need installing beside it).
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
gpu-check:
	PYTHONPATH=$(CURDIR):$(CURDIR)/bench $(GPU_PYTHON) -m mrcnn_bench gpu-check --out out/gpu-check

lint: $(STAMP)
	$(VENV)/bin/ruff check .

# asv: every figure tracked across commits (bench/asv_suite; results/asv/README.md). Each commit
# is measured once: the inference cases share one ruler's rounds in 4 processes, the training step
# has its own (mrcnn_bench.history.shared_rounds); asv-fixture trains the fixed
# checkpoint whose AP each commit's inference scores (once per machine, cached in .asv/fixtures).
# main's history starts at the commit that landed the harness's current layout; the scratch range
# (mrcnn-bench asv scratch) holds 3 injected regressions among 4 commits that change no code.
HISTORY_FROM := 25ad72d
SCRATCH_RANGE := asv-scratch~7..asv-scratch
# The steps range: a 3% and a 5% slowdown, each confined to one stage, among 27 commits that change
# no code; its base (main's 70c91c7) is measured too, as the first level's first point.
STEPS_RANGE := asv-steps~29^..asv-steps
# asv's machine: CPU, cores and fixture (mrcnn-bench asv machine), so that results from
# another host or another fixture start a series of their own. Named when a recipe runs, after
# asv-fixture has made the fixture, by one call that also registers it; its failure (no fixture:
# exit 2) stops the recipe before asv runs.
# Resumable: a benchmark already measured at a commit under the suite's current version is skipped,
# one measured under an older version is measured again (asv's --skip-existing; a commit is
# skipped whole only when all of its benchmarks are current).
ASV_SKIP := --skip-existing
ASV_RUN = name=$$($(BENCH) asv machine --register) && $(VENV)/bin/asv run --machine "$$name"

asv-fixture: $(STAMP)
	$(BENCH) asv fixture make

asv-scratch: $(STAMP)
	$(BENCH) asv scratch
	$(BENCH) asv scratch --range steps

asv-same: asv-fixture
	$(ASV_RUN) --python=same --set-commit-hash $$(git rev-parse HEAD) --show-stderr

asv-commits: asv-fixture
	$(ASV_RUN) --show-stderr $(ASV_SKIP) $(or $(RANGE),HEAD~2..HEAD)

# main's history; resumable (commits already measured are skipped). The commits that change the
# code under test (mrcnn/ or the dependencies; `git rev-list` in the recipe names them): the harness
# comes from this checkout, so every other commit measures the same code as the last of these before
# it. 8 to 13.5 minutes a commit, by host: more than one session may add to it, on the same kind of
# host (the machine name).
asv-history: asv-fixture
	mkdir -p .asv && git rev-list $(HISTORY_FROM)^..main -- mrcnn pyproject.toml > .asv/history_commits.txt
	$(ASV_RUN) --show-stderr $(ASV_SKIP) HASHFILE:.asv/history_commits.txt

# The held figures of every commit one machine has (this host's by default), oldest first. A
# machine that holds main's history and the scratch range needs one table per line of commits:
# REVS=main (or REVS=$(SCRATCH_RANGE)) keeps the commits git rev-list names, OUT names the file.
asv-table: $(STAMP)
	name=$${MACHINE:-$$($(BENCH) asv machine)} && \
	$(BENCH) asv table "$$name" --steps $(if $(REVS),--revs '$(REVS)') \
		--out "$${OUT:-results/asv/$$name.md}"

# The scratch range with its three injected regressions (7 commits x 8-13.5 minutes).
asv-scratch-run: asv-fixture asv-scratch
	$(ASV_RUN) --show-stderr $(ASV_SKIP) $(SCRATCH_RANGE)

# The steps range: is a 3% or a 5% step found at its commit, with its stage (29 commits and the base,
# about 2.5 hours; resumable).
# Measured with its levels interleaved (asv scratch --measure-order), so a partial run is balanced.
asv-steps-run: asv-fixture asv-scratch
	mkdir -p .asv && $(BENCH) asv scratch --range steps --measure-order > .asv/steps_commits.txt
	$(ASV_RUN) --show-stderr $(ASV_SKIP) HASHFILE:.asv/steps_commits.txt

# The same commit measured 5 times: the A/A spread of each tracked figure, into a folder of this
# machine's own (SPREAD_OUT; resumable, and a folder of another plan or host kind is refused).
asv-spread: asv-fixture
	name=$$($(BENCH) asv machine) && $(BENCH) asv spread --runs 5 --out "$${SPREAD_OUT:-results/asv/aa_$$name}"

# The dashboard, built into results/html (git-ignored: generated output is not committed; the
# screenshots under results/asv/screenshots show that it renders), with its scripts made local.
# Then the change points of every line (mrcnn-bench steps' method) beside asv's flags, with a block
# ready to file per regression: results/asv/regressions_report.md (committed) and the page
# changes.html of the dashboard. NOISE: the A/A studies that size each block's confirm command
# (DIR for every machine, MACHINE=DIR for one: each host kind scatters its own way).
NOISE ?= results/asv/aa_shared_f6m207 amd-epyc-f25m17-2c-fx021d390f=results/asv/aa_shared_f25m17
asv-publish: asv-scratch $(OTAVA_STAMP)
	$(VENV)/bin/asv publish
	$(BENCH) asv offline-html results/html
	$(BENCH) asv report $(foreach n,$(NOISE),--noise $(n)) \
		--md results/asv/regressions_report.md --html results/html/changes.html

# The dashboard on http://127.0.0.1:8080, this machine only (no network needed: its scripts are in
# results/html). Run make asv-publish first: it builds results/html, which is not committed.
# asv preview would listen on every interface.
PORT ?= 8080
asv-serve:
	@echo "dashboard: http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	$(PYTHON) -m http.server --bind 127.0.0.1 --directory results/html $(PORT)

clean:
	rm -rf $(VENV) $(OTAVA_VENV) .pytest_cache .ruff_cache .benchmarks .asv out
