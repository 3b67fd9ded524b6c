# Two entry points for a fresh machine: `make demo` (the main job) and `make test` (the whole suite,
# as CI runs it); `make test-fast` runs tests/unit only (no training, no other process).
# Both create .venv when it is absent and install everything into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.capsagg-installed

.PHONY: setup test test-fast demo quick params tables compile-check clean-venv

setup: $(STAMP)

$(STAMP): setup.py requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel setuptools
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q cython numpy -c requirements.txt
	$(PIP) install -q --no-deps --no-build-isolation fairseq-fixed==0.12.3.1
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps --no-build-isolation -e .
	$(PY) -c "import torch, fairseq, fairseq_capsagg; print('installed: torch', torch.__version__, '| fairseq', fairseq.__version__)"
	touch $(STAMP)

# The whole suite in two test workers of one thread each (pytest-xdist, a file per worker at a time): on 2
# cores, processes of two threads each would spin-wait on cores the other worker holds. The fast lane
# (tests/unit) is quicker in one worker. The 15 slowest tests close the report: where the suite's minutes go
# on the machine that ran it (CI's log included), against the 15-minute limit.
PYTEST := OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile --durations=15

test: setup
	$(PYTEST) tests

test-fast: setup
	$(PY) -m pytest -q tests/unit

demo: setup
	$(PY) examples/main_job.py

quick: setup
	$(PY) examples/main_job.py --quick

params: setup
	$(VENV)/bin/capsagg-params

# The compile check against another Triton than .venv's (default 3.6.0, the one torch 2.11 ships): that Triton goes
# into .triton-$(TRITON)/ (ignored; delete it when done), ahead of .venv's on the path, and every kernel variant the
# models launch is compiled for sm_80 and sm_90 (benchmarks/compiled_kernels.py; the suite does it with .venv's).
TRITON ?= 3.6.0
compile-check: setup
	test -d .triton-$(TRITON) || $(PIP) install -q --no-deps --target .triton-$(TRITON) triton==$(TRITON)
	PYTHONPATH=.triton-$(TRITON) $(PY) benchmarks/compiled_kernels.py --targets 80 90

# The README's results at a glance and docs/results.md's converged runs, from the published JSONs (a test runs
# these lines and compares).
R := docs/results
tables: setup
	$(PY) -m fairseq_capsagg.pipeline.reports.summary glance --one-epoch $(R)/table1-cpu.json $(R)/peers-cpu.json $(R)/mhc/peers-cpu.json $(R)/streams/peers-cpu.json $(R)/dynrouting-capsules-cpu.json --converged $(R)/converged-cpu.json $(R)/converged-run2/converged-cpu.json --equivalence $(R)/compute-equivalence.json --write README.md
	$(PY) -m fairseq_capsagg.pipeline.reports.summary converged-runs --converged $(R)/converged-cpu.json $(R)/converged-run2/converged-cpu.json $(R)/converged-gpu.json --write docs/results.md
	$(PY) -m fairseq_capsagg.pipeline.reports.summary equivalence --equivalence $(R)/compute-equivalence.json --write docs/results.md

clean-venv:
	rm -rf $(VENV)
