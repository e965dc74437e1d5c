# Two commands do everything on a fresh machine (see README):
#   make train   - set up .venv from the lock, then run `shardsched train` with its embedded default
#   make test    - set up .venv from the lock, then run the whole test suite
# TORCH can name another build, e.g. `make test TORCH=torch` on a CUDA machine.
# Also: `make check-latest` (the fast tests on the newest versions pyproject.toml allows, in a
# scratch venv: drift is seen before users see it), `make lock` (rewrite requirements.lock).
VENV   ?= .venv
PY     := $(VENV)/bin/python
TORCH  ?= torch==2.13.0
PIP    ?= pip==26.3
LATEST ?= .venv-latest
# pytest-xdist workers: CI has 2 cores (tests/test_readme.py splits its commands to share them).
JOBS   ?= 2
# Tests that need no worker processes: a few minutes on 2 cores.
FAST_TESTS ?= tests/cost tests/sim tests/solve tests/models tests/optim tests/test_fmt.py \
              tests/test_cli_plan.py tests/test_json_stdout.py tests/profile/test_analytic.py \
              tests/profile/test_trace.py tests/plan/test_plan_hf_cli.py

.PHONY: train test check-latest lock bench clean

# The lock holds every version but torch's; --no-deps on the project itself so nothing
# unlocked slips in, and `pip check` proves the lock satisfies pyproject.toml's ranges.
$(VENV)/.installed: pyproject.toml requirements.lock
	python3 -m venv $(VENV)
	$(PY) -m pip install -q "$(PIP)"
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -r requirements.lock
	$(PY) -m pip install -q --no-deps -e '.[test]'
	$(PY) -m pip check
	touch $@

train: $(VENV)/.installed
	$(VENV)/bin/shardsched train

test: $(VENV)/.installed
	$(PY) -m pytest tests -n $(JOBS) --durations=25

# torch stays $(TORCH) (a constraint): the newest on the index is a CUDA build of GBs.
check-latest:
	rm -rf $(LATEST)
	python3 -m venv $(LATEST)
	$(LATEST)/bin/python -m pip install -q --upgrade pip
	echo "$(TORCH)" > $(LATEST)/constraints.txt
	$(LATEST)/bin/python -m pip install -q "$(TORCH)"
	$(LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -c $(LATEST)/constraints.txt -e '.[test]'
	$(LATEST)/bin/python -m pip freeze --exclude-editable > $(LATEST)/versions.txt
	$(LATEST)/bin/python -m pytest $(FAST_TESTS) -n $(JOBS)

lock: check-latest
	{ sed -n '/^#/p' requirements.lock; grep -iv '^torch==' $(LATEST)/versions.txt; } > requirements.lock.new
	mv requirements.lock.new requirements.lock

bench: $(VENV)/.installed
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) $(LATEST)
