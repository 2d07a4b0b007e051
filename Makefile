# Two commands do all the set-up: `make run` (the product) and `make test` (the whole suite).
.DEFAULT_GOAL := help
SHELL := /bin/bash

# Django 6 needs Python 3.12+: the first one found (pyenv's installs count).
PYTHON ?= $(shell for p in python3.12 python3.13 $$HOME/.pyenv/versions/3.12*/bin/python3 $$HOME/.pyenv/versions/3.13*/bin/python3; do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
VAR := var
PORT ?= 8000
# The local LLM's runtime is built for the portable x86-64 baseline (AVX2) by tools/install-llm;
# LLM_NATIVE=1 builds it for this machine's CPU only (faster here, crashes on other CPUs).
LLM_NATIVE ?= 0
LLM_BUILD := $(if $(filter 1,$(LLM_NATIVE)),native,portable)

.PHONY: help run test test-fast bench chaos lint install-run install-test install-dev models \
	test-models embedding-model secret-key browser loadgen java

help:
	@echo "make run    - install everything, seed the demo and run web, worker, broker and LLM"
	@echo "make test   - install everything and run the whole test suite on SQLite and PostgreSQL,"
	@echo "              with its coverage floor (what CI runs)"
	@echo "make test-fast - the unit tier on SQLite with a coverage report, in under 3 minutes: no"
	@echo "              local LLM, browser, started process, fault suite, benchmark or stress test"
	@echo "make bench  - run the benchmarks (local LLM speed, pipeline and review page on both"
	@echo "              databases, the reviewer's day, the gateway, curation, export, learning,"
	@echo "              production replay, agents)"
	@echo "make chaos  - inject faults into the real loop and print what was lost or stuck"
	@echo "make lint   - ruff, mypy and the import layers (import-linter)"
	@echo "make loadgen - hey and LiteLLM's proxy, for the gateway benchmark (make test and make bench"
	@echo "              install them)"
	@echo "make java   - Debian's headless Java, for the ScienceWorld benchmark (make test and make bench"
	@echo "              install it)"

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "Python 3.12 or newer is required (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Each stamp is rebuilt when pyproject.toml changes; pip's wheel cache makes re-runs fast.
# tools/install-llm compiles llama.cpp's server (once per machine: it keeps the binary in its
# own cache, never pip's, which may hold a build for another CPU) while pip installs the
# packages beside it and then the models are downloaded and checked, so the first run waits
# for the longer of the two, not for both.
TEST_EXTRAS := .[dev,embedded]
define install_with_llm
	LLM_NATIVE=$(LLM_NATIVE) tools/install-llm $(BIN)/pip & llm=$$!; \
	$(BIN)/pip install --quiet -e "$(1)" && $(BIN)/python manage.py build_models --llm; \
	packages=$$?; wait $$llm && test $$packages = 0
endef

# Names the llama.cpp build asked for (portable or native), so switching LLM_NATIVE reinstalls.
$(VENV)/.llm-build-%: | $(BIN)/python
	@rm -f $(VENV)/.llm-build-*
	@touch $@

$(VENV)/.installed-run: pyproject.toml tools/install-llm $(VENV)/.llm-build-$(LLM_BUILD) | secret-key
	$(call install_with_llm,.[embedded])
	@touch $@

# The Berkeley Function Calling Leaderboard's data and checker (bench_bfcl): its package pins
# numpy 1.x and pulls torch for evaluators we never run, so it goes in without its
# dependencies; bench/bfcl.py reads only its data files and its AST checker.
BFCL_EVAL := bfcl-eval==2026.3.23
$(VENV)/.installed-test: pyproject.toml tools/install-llm $(VENV)/.llm-build-$(LLM_BUILD) | secret-key
	$(call install_with_llm,$(TEST_EXTRAS))
	$(BIN)/pip install --quiet --no-deps "$(BFCL_EVAL)"
	@touch $@ $(VENV)/.installed-run $(VENV)/.installed-dev

# The packages alone: the unit tier and the linters never start the local LLM, so a machine
# that runs only them never compiles it (about 7 minutes on two cores).
$(VENV)/.installed-dev: pyproject.toml | secret-key
	$(BIN)/pip install --quiet -e "$(TEST_EXTRAS)"
	$(BIN)/pip install --quiet --no-deps "$(BFCL_EVAL)"
	@touch $@

install-run: $(VENV)/.installed-run
install-test: $(VENV)/.installed-test
install-dev: $(VENV)/.installed-dev

secret-key: | $(BIN)/python
	@mkdir -p $(VAR)
	@test -s $(VAR)/secret_key || { $(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(64))' > $(VAR)/secret_key; chmod 600 $(VAR)/secret_key; }

models: secret-key
	$(BIN)/python manage.py build_models --llm

# The LLM tier's tests run the smallest model, for speed (tests/settings.py); the default
# model's own test (tests/integration/test_default_model.py) runs the default.
test-models: models
	LOCAL_LLM=smollm2-135m $(BIN)/python manage.py build_models --llm

# The embedding model alone (the unit tier embeds text; it never starts the local LLM).
embedding-model: install-dev secret-key
	$(BIN)/python manage.py build_models

run: install-run models
	$(BIN)/python manage.py migrate --noinput
	$(BIN)/python manage.py seed_demo
	$(BIN)/python manage.py runstack --port $(PORT)

# Browser tests drive Debian's Chromium (Playwright's own browser download is not used).
browser:
	@command -v chromium >/dev/null || { \
		test "$$(id -u)" = 0 || { echo "Install Debian's chromium (apt-get install -y chromium)"; exit 1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# ScienceWorld (bench_scienceworld) runs its simulator on the JVM: Debian's headless Java.
java:
	@command -v java >/dev/null || { \
		test "$$(id -u)" = 0 || { echo "Install Debian's Java (apt-get install -y default-jre-headless)"; exit 1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq default-jre-headless; }

# The gateway benchmark's load generator (Debian's hey, compiled) and its yardstick, LiteLLM's
# proxy, in a virtualenv of its own at the litellm version the product pins.
LITELLM_VERSION := $(shell sed -n 's/.*"litellm==\([0-9.]*\)".*/\1/p' pyproject.toml)
LITELLM_PROXY := $(HOME)/.cache/icrlhf/litellm-proxy-$(LITELLM_VERSION)
loadgen:
	@command -v hey >/dev/null || { \
		test "$$(id -u)" = 0 || { echo "Install Debian's hey (apt-get install -y hey)"; exit 1; }; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hey; }
	@test -f $(LITELLM_PROXY)/.installed || { rm -rf $(LITELLM_PROXY) && \
		$(PYTHON) -m venv $(LITELLM_PROXY) && \
		$(LITELLM_PROXY)/bin/pip install --quiet "litellm[proxy]==$(LITELLM_VERSION)" && \
		touch $(LITELLM_PROXY)/.installed; }

# The whole suite on SQLite, then on PostgreSQL when one answers (DATABASE_URL, else
# 127.0.0.1:5432); it says which databases it ran on.
test: install-test test-models browser loadgen java lint
	tools/run-tests $(BIN)/python $(PYTEST_ARGS)

# The unit tier: the tests with none of the slow tiers' markers (pyproject; tests/conftest.py
# puts them on by folder, fixture and module), on SQLite, with a coverage report: 93 % on
# 2026-11-29. Its floor is 5 points under the whole run's (tools/run-tests), so moving a
# test between tiers does not fail it; CI enforces the whole run's.
FAST_TIER := not integration and not llm and not chaos and not bench and not browser and not slow
FAST_COVERAGE_FLOOR := 85
# With PYTEST_ARGS (a file, a -k expression), it runs those tests of the tier without the
# coverage report, whose floor only the whole tier can reach.
FAST_COVERAGE := $(if $(PYTEST_ARGS),--no-cov,--cov --cov-report=term:skip-covered \
	--cov-fail-under=$(FAST_COVERAGE_FLOOR))
test-fast: install-dev embedding-model
	env -u DATABASE_URL COVERAGE_CORE=sysmon $(BIN)/python -m pytest -m "$(FAST_TIER)" \
		$(FAST_COVERAGE) $(PYTEST_ARGS)

# The pipeline and review benchmarks run on SQLite, then on PostgreSQL when one answers.
bench: install-test models secret-key loadgen java
	$(BIN)/python manage.py bench_llm $(BENCH_ARGS)
	$(BIN)/python manage.py bench_pipeline $(BENCH_ARGS)
	$(BIN)/python manage.py bench_pipeline --local-model $(BENCH_ARGS)
	$(BIN)/python manage.py bench_review $(BENCH_ARGS)
	@postgres=$$(tools/postgres-url $(BIN)/python); \
	if [ -n "$$postgres" ]; then \
		$(BIN)/python manage.py bench_pipeline --database-url "$$postgres" $(BENCH_ARGS) && \
		$(BIN)/python manage.py bench_review --database-url "$$postgres" $(BENCH_ARGS); \
	else echo "No PostgreSQL answers: the pipeline and review benchmarks ran on SQLite only."; fi
	$(BIN)/python manage.py bench_workbench $(BENCH_ARGS)
	$(BIN)/python manage.py bench_gateway $(BENCH_ARGS)
	$(BIN)/python manage.py bench_embedders $(BENCH_ARGS)
	$(BIN)/python manage.py bench_curation $(BENCH_ARGS)
	$(BIN)/python manage.py bench_export $(BENCH_ARGS)
	$(BIN)/python manage.py bench_learning $(BENCH_ARGS)
	$(BIN)/python manage.py bench_traffic $(BENCH_ARGS)
	$(BIN)/python manage.py bench_agent $(BENCH_ARGS)

chaos: install-test models secret-key
	$(BIN)/python manage.py chaos $(CHAOS_ARGS)

# Style, types, and the layers of pyproject's import-linter contract.
lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy icrlhf worker bench
	$(BIN)/lint-imports --no-logo --no-cache
