# Entry points for a fresh machine (see README): `make demo` and `make test`; `make torch` is opt-in.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of PyTorch (the plain `torch` wheel pulls several GB of CUDA libraries). Only
# scripts/record_pytorch.py needs it, to record new PyTorch profiles; xsim itself never imports torch.
TORCH := torch==2.13.0+cpu

.PHONY: demo test venv torch record-profiles clean

# The editable install is a plain path entry for the checkout (setuptools' editable_mode=compat) rather than
# setuptools' default import hook, which loads pathlib and importlib.util at every interpreter start:
# ~10 ms of `xsim --help` (docs/performance.md, round 4). setuptools calls that mode transitional; where
# it is gone, the default install runs instead.
EDITABLE := --config-settings editable_mode=compat

$(BIN)/xsim: pyproject.toml
	@echo "make: creating $(VENV) and installing xsim with its test tools (protobuf, numpy, polars, networkx,"
	@echo "      pyyaml, rich, dask, matplotlib, pytest, hypothesis, ruff, grpcio-tools): about 2-3 minutes once"
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' $(EDITABLE) || $(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/xsim

venv: $(BIN)/xsim

demo: venv
	$(BIN)/xsim demo

test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

# Opt-in: the CPU wheel of torch, for recording new profiles (and the one test that records, which skips
# without torch).
torch: venv
	$(BIN)/pip install -q '$(TORCH)'

record-profiles: torch
	$(BIN)/python scripts/record_pytorch.py --out traces/examples/pytorch --ranks 1 2 --pipeline

clean:
	rm -rf $(VENV) build *.egg-info
