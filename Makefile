# Two entry points for a fresh machine (see README): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test venv clean

$(BIN)/xsim: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q torch==2.13.0
	touch $(BIN)/xsim

venv: $(BIN)/xsim

demo: venv
	$(BIN)/xsim demo

test: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info
