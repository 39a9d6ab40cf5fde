# make run    set up, then fetch a real SGLang release and run diff / apply / status / revert on it
#             (of the diff: its stat and first hunk; make run FULL_DIFF=1 prints all of it)
# make test   set up, then run the whole test suite (CPU only; downloads SGLang releases, cached)
# make bench  apply time on 0.5.12, the static round trip over every release, and `dynspec matrix`
# make fuzz   the whole fault suite (make test runs a sample): every fuzzed variant, every second kill
# make docs   regenerate README's supported-releases table from matrix.json
# make test-torch  the tests that need real torch (CPU): the runtime's tensor code and the real-weights
#                  tools (the [real] extra), in their own venv .venv-torch (torch: ~3 GB)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SGLANG_VERSION ?= 0.5.12

.PHONY: setup run test test-torch fuzz bench docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@echo "setting up $(VENV): pip install -e '.[test]' (once; about 30 s)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

run: setup   # FULL_DIFF=1: the whole diff, not its stat and first hunk
	@$(BIN)/python scripts/demo.py $(SGLANG_VERSION) $(if $(FULL_DIFF),--full-diff)

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

TORCH_VENV ?= .venv-torch
test-torch:
	@[ -x $(TORCH_VENV)/bin/python ] || $(PYTHON) -m venv $(TORCH_VENV)
	@$(TORCH_VENV)/bin/python -m pip install -q --disable-pip-version-check -e '.[test,real]'
	@$(TORCH_VENV)/bin/python -c "import torch, transformers, tokenizers"  # the tests skip without them: fail here instead
	$(TORCH_VENV)/bin/python -m pytest -q tests/patches/test_dynspec_rounding_torch.py tests/real

fuzz: setup
	DYNSPEC_FAULTS=full $(BIN)/python -m pytest -q -s tests/faults

bench: setup
	$(BIN)/python benchmarks/bench_apply.py
	$(BIN)/python benchmarks/bench_matrix.py

docs: setup
	$(BIN)/python -m patcher.matrix

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
