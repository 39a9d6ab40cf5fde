# make run    set up, then fetch a real SGLang release and run diff / apply / status / revert on it
# make test   set up, then run the whole test suite (CPU only; downloads SGLang releases, cached)
# make bench  apply time on 0.5.12 and the static round trip over every release
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SGLANG_VERSION ?= 0.5.12

.PHONY: setup run test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

run: setup
	$(BIN)/python scripts/demo.py $(SGLANG_VERSION)

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python benchmarks/bench_apply.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
