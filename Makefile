# Entry points for a fresh machine (see README): `make demo` and `make test` (`make test-fast` for a quick
# pass). `make test` also installs the CPU build of torch, which the one recording test needs.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# PyTorch 2.13.0 as this project's registry serves it (the CPU build, 2.13.0+cpu; ~50 s to install). Only
# scripts/record_pytorch.py and the test that runs it need it, to record new PyTorch profiles; xsim itself
# never imports torch.
TORCH := torch==2.13.0

.PHONY: demo test test-fast venv torch record-profiles clean

# The editable install is a plain path entry for the checkout (setuptools' editable_mode=compat) rather than
# setuptools' default import hook, which loads pathlib and importlib.util at every interpreter start:
# ~10 ms of `xsim --help` (docs/performance.md, round 4). setuptools calls that mode transitional; where
# it is gone, the default install runs instead.
EDITABLE := --config-settings editable_mode=compat

$(BIN)/xsim: pyproject.toml
	@echo "make: creating $(VENV) and installing xsim (distribution xsim-replay) with its test tools: protobuf,"
	@echo "      numpy, polars, networkx, pyyaml, rich, dask, distributed, matplotlib, pytest, hypothesis, ruff,"
	@echo "      grpcio-tools, pyinstrument (about 2-3 minutes once; nothing else)"
	@start=$$(date +%s); \
	$(PY) -m venv $(VENV) && \
	$(BIN)/pip install -q --disable-pip-version-check --upgrade pip && \
	{ $(BIN)/pip install -q --disable-pip-version-check -e '.[dev]' $(EDITABLE) || \
	  $(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'; } && \
	echo "make: installed in $$(( $$(date +%s) - start )) s" && touch $(BIN)/xsim

venv: $(BIN)/xsim

demo: venv
	$(BIN)/xsim demo

# The whole suite: ~30 minutes of wall time on a 2-core machine (~460 CPU-s); -rs says why each skip skipped
# (no Chromium/speedscope, no ../shared/peer_traces). torch is installed first so the recording test runs.
test: venv torch
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@echo "make: the whole suite, about 30 minutes on 2 cores (make test-fast: about 3)"
	$(BIN)/python -m pytest -rs

# A quick pass, about 3 minutes on 2 cores: the README's tour, the CLI, and a unit test file of each area
# (tests/fast.txt lists them).
test-fast: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -rs $$(grep -v '^#' tests/fast.txt)

# torch for recording new profiles and for the one test that records (pip does nothing once it is there).
torch: venv
	$(BIN)/pip install -q --disable-pip-version-check '$(TORCH)'

record-profiles: torch
	$(BIN)/python scripts/record_pytorch.py --out traces/examples/pytorch --ranks 1 2 --pipeline

clean:
	rm -rf $(VENV) build *.egg-info
