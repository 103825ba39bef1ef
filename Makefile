# Entry points for a fresh machine (see README): `make demo` and `make test` (`make test-fast` for a quick
# pass); `make torch` is opt-in.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch (the plain `torch` wheel pulls several GB of CUDA libraries). Only
# scripts/record_pytorch.py needs it, to record new PyTorch profiles; xsim itself never imports torch.
TORCH := torch==2.13.0+cpu
# The `+cpu` builds are served by PyTorch's own wheel index, not PyPI (pytorch.org's install selector: pip,
# Linux, CPU); PyPI still serves torch's dependencies, hence an extra index rather than the only one.
TORCH_INDEX := https://download.pytorch.org/whl/cpu

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
# (no Chromium/speedscope, no ../shared/peer_traces, no torch).
test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@echo "make: the whole suite, about 30 minutes on 2 cores (make test-fast: about 3)"
	$(BIN)/python -m pytest -rs

# A quick pass, about 3 minutes on 2 cores: the README's tour, the CLI, and a unit test file of each area
# (tests/fast.txt lists them).
test-fast: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -rs $$(grep -v '^#' tests/fast.txt)

# Opt-in: the CPU wheel of torch, for recording new profiles (and the one test that records, which skips
# without torch).
torch: venv
	$(BIN)/pip install -q '$(TORCH)' --extra-index-url $(TORCH_INDEX)

record-profiles: torch
	$(BIN)/python scripts/record_pytorch.py --out traces/examples/pytorch --ranks 1 2 --pipeline

clean:
	rm -rf $(VENV) build *.egg-info
