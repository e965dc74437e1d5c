# Two commands do everything on a fresh machine (see README):
#   make train   - set up .venv, then run `shardsched train` with its embedded default
#   make test    - set up .venv, then run the whole test suite
# TORCH can name another build, e.g. `make test TORCH=torch` on a CUDA machine.
VENV  ?= .venv
PY    := $(VENV)/bin/python
TORCH ?= torch==2.13.0

.PHONY: train test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

train: $(VENV)/.installed
	$(VENV)/bin/shardsched train

test: $(VENV)/.installed
	$(PY) -m pytest tests

bench: $(VENV)/.installed
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV)
