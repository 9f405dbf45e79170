# Every target bootstraps .venv itself, so a fresh machine needs only Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint serve bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "agent-gateway needs Python >= 3.11, got " + sys.version' 
	$(PYTHON) -m venv $(VENV) || { echo "could not create $(VENV): on Debian install python3-venv (apt-get install python3.11-venv)"; exit 2; }

$(STAMP): $(BIN)/python pyproject.toml
	@# the sandbox's helper (gateway/sandbox/agw_init.c) is compiled on first use: a C compiler
	@command -v cc >/dev/null || command -v gcc >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null; } || echo "no C compiler: install gcc (the sandbox needs it)"
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check gateway tests bench
	$(BIN)/ruff format --check gateway tests bench
	$(BIN)/mypy

test: lint
	@# tests/programs/test_strace.py checks each program model against the real program under strace
	@command -v strace >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq strace >/dev/null; } || echo "no strace: the program models go unchecked (apt-get install strace)"
	@command -v rg >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get install -y -qq ripgrep >/dev/null; } || echo "no ripgrep: rg's model goes unchecked (apt-get install ripgrep)"
	$(BIN)/pytest -q

HOST ?= 127.0.0.1
PORT ?= 8765
PROFILE ?= gateway

# The gateway on localhost with the shipped policy: creates workspace/ and audit/, issues a
# fresh token and prints the URL, the token and client configuration to copy.
serve: $(STAMP)
	$(BIN)/gateway serve --http $(HOST):$(PORT) --quickstart --policy policies/default.yaml --audit-dir audit \
		--profile $(PROFILE)

bench: $(STAMP)
	$(BIN)/python bench/analysis.py
	$(BIN)/python bench/corpus.py
	$(BIN)/python bench/sessions.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/hooks.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
