# `make train` and `make test` do all the set-up on a fresh machine: they create .venv if it is missing and install
# exactly what uv.lock pins (re-installing only when pyproject.toml or uv.lock changes). docs/install.md says what
# the lock holds, why, and how to install without make or without uv.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The same as pyproject's dev group, so that `uv sync` keeps it.
UV_VERSION := 0.13.10
# The extras the one environment holds: test brings ray, mlflow, wandb, postgres, kernel and docs.
EXTRAS := --extra test
ARGS ?=

.PHONY: train test soak docs docs-serve install check-latest clean-venv

$(BIN)/python:
	@echo "== make: creating $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)

# uv installs into the venv it lives in; pip only bootstraps it.
$(BIN)/uv: | $(BIN)/python
	@echo "== make: installing uv $(UV_VERSION) into $(VENV)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"

# --locked: the lock is installed as it is, and a uv.lock older than pyproject.toml is an error, never re-resolved
# here. --compile-bytecode, as pip does: else the first import of tf_agents prints its SyntaxWarnings.
$(STAMP): pyproject.toml uv.lock | $(BIN)/uv
	@echo "== make: installing uv.lock into $(VENV) (TensorFlow, TF-Agents, Reverb, Ray, MLflow, W&B, ...)"
	@start=$$(date +%s); \
	UV_PYTHON_DOWNLOADS=never $(BIN)/uv sync --locked $(EXTRAS) --compile-bytecode --python $(BIN)/python && \
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

# The newest releases pyproject.toml allows, ignoring the lock, in a venv of their own (.venv-latest), and the suite
# run there: a failure names the package that broke (docs/testing.md#catching-drift-make-check-latest).
check-latest: $(STAMP)
	SDL_AUDIODRIVER=dummy $(BIN)/python scripts/check_latest.py $(ARGS)

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

# The path without uv (docs/install.md): uv.lock as a requirements file with hashes, for `pip install --no-deps -r`.
# Re-made after `uv lock`; tests/test_environment.py checks it is current.
requirements-lock.txt: uv.lock | $(BIN)/uv
	$(BIN)/uv export --frozen --no-emit-project $(EXTRAS) --quiet -o requirements-lock.txt
