# capacity-pilot — the commands infra teams and CI use.
# `make test` is what CI runs (.ci/run); it must work on a fresh machine that has only
# the Rust toolchain, Python 3.11 and Node: everything else is installed here, pinned.

SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= python3
CARGO ?= cargo
# Pinned test tooling, installed into $(VENV) by `make venv`.
MOTO_VERSION := 5.2.5
WERKZEUG_VERSION := 3.1.9

.PHONY: test lint fmt run venv schemas

## test: every test, lint included (what CI runs)
test: lint venv
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

## lint: formatting and clippy with warnings as errors
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## schemas: regenerate infra/events/schemas/ from the Rust event types
schemas:
	UPDATE_SCHEMAS=1 $(CARGO) test -p capacity-pilot --test domain schemas

## venv: the pinned Python tools the tests need (moto's DynamoDB server)
venv: $(VENV)/.installed

# moto's own dependencies are pinned too (a constraints file), so a new boto3 cannot break it.
$(VENV)/.installed: Makefile tests/support/moto-constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check \
		-c tests/support/moto-constraints.txt \
		"moto[server]==$(MOTO_VERSION)" "werkzeug==$(WERKZEUG_VERSION)"
	touch $@

## run: the whole lifecycle offline (not built yet)
run:
	@echo "make run: not built yet." >&2
	@echo "Missing: launch-workloads, replace-unhealthy and cleanup-expired as finished functions" >&2
	@echo "(issue 5), the SAM template's rules and functions (issue 6), and the local runner with" >&2
	@echo "its Lambda host and local EventBridge (issue 7)." >&2
	@echo "What exists: the domain and planner, the DynamoDB store, the AWS adapters, the" >&2
	@echo "search-offerings and purchase-capacity handlers (make test), and the offline AWS" >&2
	@echo "stand-in: cargo run -p local-cloud -- serve --port 4599 --seed 1" >&2
	@exit 1
