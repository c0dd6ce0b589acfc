# `make train` and `make test` do all the set-up on a fresh machine: they create .venv if it is
# missing and install the pinned dependencies (re-installing only when pyproject.toml changes).
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: train test soak test-tracking docs docs-serve install clean-venv

# The install says what it does: a line per phase, then pip's own lines (each package as it is collected, then
# "Installing collected packages", the longest step, while TensorFlow and Ray unpack), then the time it took.
$(BIN)/python:
	@echo "== make: creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	@echo "== make: installing the pinned dependencies into $(VENV) (TensorFlow, TF-Agents, Reverb, Ray, ...): pip lists each package"
	@start=$$(date +%s); \
	$(BIN)/python -m pip install --quiet --upgrade pip && \
	$(BIN)/python -m pip install -e ".[test]" && \
	echo "== make: installed in $$(( $$(date +%s) - start )) s"
	touch $(STAMP)

install: $(STAMP)

train: $(STAMP)
	SDL_AUDIODRIVER=dummy $(BIN)/python -m dqn_cartpole train $(ARGS)

test: $(STAMP)
	SDL_AUDIODRIVER=dummy $(BIN)/python -m pytest $(ARGS)

# Ten `--topology ray` runs beside a CPU hog, five with a SIGKILL (tests/test_soak_ray.py; about 10 minutes).
soak: $(STAMP)
	SDL_AUDIODRIVER=dummy $(BIN)/python -m pytest tests/test_soak_ray.py -m soak -n 0 $(ARGS)

# The tracking tests (tests/test_tracking.py) with the real MLflow and W&B, in an environment of their own: their
# extras bring pydantic 1, which Ray 2.60 (in .venv, for the suite) refuses.
TRACKING_VENV := .venv-tracking
$(TRACKING_VENV)/.installed: pyproject.toml
	@echo "== make: installing the tracking extras into $(TRACKING_VENV) (MLflow, W&B, without Ray)"
	$(PYTHON) -m venv $(TRACKING_VENV)
	$(TRACKING_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TRACKING_VENV)/bin/python -m pip install -e ".[test-tracking]"
	touch $(TRACKING_VENV)/.installed

test-tracking: $(TRACKING_VENV)/.installed
	SDL_AUDIODRIVER=dummy $(TRACKING_VENV)/bin/python -m pytest tests/test_tracking.py $(ARGS)

# The documentation as a site (mkdocs.yml: guides, reference, explanations, benchmark records; search), in site/.
# --strict: a broken link or anchor, or a page left out of the navigation, is an error (the tests build it so too).
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict
	@echo "== make: open site/index.html in a browser (it works as files, offline: search too), or: make docs-serve"

# The same site served at http://127.0.0.1:$(DOCS_PORT)/ (mkdocs serve: rebuilt and reloaded as docs/ changes).
DOCS_PORT ?= 8000
docs-serve: $(STAMP)
	$(BIN)/python -m mkdocs serve --dev-addr 127.0.0.1:$(DOCS_PORT)

clean-venv:
	rm -rf $(VENV)
