# `make train` and `make test` do all the set-up on a fresh machine: they create .venv if it is
# missing and install the pinned dependencies (re-installing only when pyproject.toml changes).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: train test install clean-venv

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	SDL_AUDIODRIVER=dummy $(BIN)/python -m dqn_cartpole train $(ARGS)

test: $(STAMP)
	SDL_AUDIODRIVER=dummy $(BIN)/python -m pytest $(ARGS)

clean-venv:
	rm -rf $(VENV)
