# Every target bootstraps .venv itself, so a fresh machine needs only Python 3.11.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint serve bench clean clients

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
	$(BIN)/lint-imports --no-cache --no-logo

# The real agent clients tests/server/test_clients.py drives offline (pinned; about 800 MB; once).
CLIENTS_DIR ?= .cache/clients
CODEX_VERSION := 0.169.0
CLAUDE_VERSION := 2.1.332
CLIENTS_STAMP := $(CLIENTS_DIR)/.installed-$(CODEX_VERSION)-$(CLAUDE_VERSION)

$(CLIENTS_STAMP):
	@command -v npm >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; } || { echo "npm is needed to install the clients the tests drive"; exit 2; }
	mkdir -p $(CLIENTS_DIR)
	npm install --prefix $(CLIENTS_DIR) --no-audit --no-fund --loglevel=error \
		@openai/codex@$(CODEX_VERSION) @anthropic-ai/claude-code@$(CLAUDE_VERSION)
	@touch $@

clients: $(CLIENTS_STAMP)

test: lint $(CLIENTS_STAMP)
	@# tests/programs/test_strace.py checks each program model against the real program under strace
	@command -v strace >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq strace >/dev/null; } || echo "no strace: the program models go unchecked (apt-get install strace)"
	@# seed 003's zsh shell runs a real zsh in the sandbox (tests/server/test_profile_terminal_zsh.py)
	@command -v zsh >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq zsh >/dev/null; } || echo "no zsh: a zsh shell cannot start (apt-get install zsh)"
	@command -v rg >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq ripgrep >/dev/null; } || echo "no ripgrep: rg's model goes unchecked (apt-get install ripgrep)"
	@# tests/sandbox/test_egress.py installs a wheel with the system's pip inside the sandbox, through the proxy
	@/usr/bin/python3 -m pip --version >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null; } || echo "no system pip: the egress install test is skipped (apt-get install python3-pip)"
	@# tests/server/test_console_browser.py drives the web console in Debian's headless chromium
	@{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || { [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
		|| echo "no chromium: the console's browser test will fail (apt-get install chromium chromium-driver)"
	@# tests/store/ start a real PostgreSQL of their own (Debian's server binaries, as an unprivileged account)
	@{ ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null; } || { [ "$$(id -u)" = 0 ] \
		&& command -v apt-get >/dev/null && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } \
		|| echo "no PostgreSQL server: the store's tests are skipped (apt-get install postgresql)"
	AGW_CLIENTS_DIR=$(abspath $(CLIENTS_DIR)) $(BIN)/pytest -q

HOST ?= 127.0.0.1
PORT ?= 8765
PROFILE ?= gateway
POLICY ?=

# The gateway on localhost with the shipped policy (for PROFILE=NAME, its layer over it:
# policies/profiles/NAME.yaml; POLICY=FILE chooses another): creates workspace/ and audit/,
# issues a fresh token and prints the URL, the token and client configuration to copy.
serve: $(STAMP)
	$(BIN)/gateway serve --http $(HOST):$(PORT) --quickstart $(if $(POLICY),--policy $(POLICY)) --audit-dir audit \
		--profile $(PROFILE)

bench: $(STAMP)
	$(BIN)/python bench/analysis.py
	$(BIN)/python bench/corpus.py
	$(BIN)/python bench/sessions.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/hooks.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .cache
