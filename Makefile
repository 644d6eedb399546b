# capacity-pilot — the commands infra teams and CI use.
# `make test` is what CI runs (.ci/run); it must work on a fresh machine that has only
# the Rust toolchain and Python 3.11: everything else is installed here, pinned.

SHELL := /bin/bash
VENV ?= .venv
PYTHON ?= python3
CARGO ?= cargo
# Pinned test tooling, installed into $(VENV) by `make venv`.
MOTO_VERSION := 5.2.5
WERKZEUG_VERSION := 3.1.9
CFN_LINT_VERSION := 1.58.0
CHECKOV_VERSION := 3.3.30
CARGO_LAMBDA_VERSION := 1.9.2
# checkov's pins conflict with moto's, so the IaC tools get their own environment in $(VENV).
IAC := $(VENV)/iac
TEMPLATE := infra/template.yaml
FORWARDER := infra/region-forwarder.yaml

.PHONY: test lint lint-rust lint-iac fmt soak run venv venv-iac schemas build bench deploy sam-check deploy-forwarders destroy cost \
	mutants mutants-extension mutants-store mutants-tree mutants-shards mutants-again mutants-again-run \
	mutants-report no-mutants

## test: every test, lint included (what CI runs)
test: lint venv
	# the local runner's test plays the default scenario with the real function binaries
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --all-targets
	$(CARGO) test --workspace --doc

## lint: Rust formatting and clippy with warnings as errors, cfn-lint and checkov on both templates
lint: lint-rust lint-iac

lint-rust: no-mutants
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# A check is suppressed only in the template, beside the resource, with its reason.
# checkov knows no AWS::LanguageExtensions: a Fn::ForEach in Resources makes it drop the SAM
# Globals (every function would lack its dead-letter queue) and skip what the loop makes. So it
# scans each template as deployed: expanded by cfn-lint's implementation of the transforms
# (Fn::ForEach, and the Globals merged into the functions), as JSON under $(IAC_EXPANDED).
IAC_EXPANDED := $(IAC)/expanded
define EXPAND_TEMPLATES
import json, os, sys
from cfnlint.decode import decode
from cfnlint.template import Template
for path in sys.argv[2:]:
    template, errors = decode(path)
    if not errors:
        cfn = Template(path, template)
        errors = cfn.transform()
    if errors:
        sys.exit("\n".join(f"{path}: {e}" for e in errors))
    cfn.template.pop("Globals", None)
    name = os.path.splitext(os.path.basename(path))[0] + ".json"
    with open(os.path.join(sys.argv[1], name), "w") as out:
        json.dump(cfn.template, out, indent=1)
endef
export EXPAND_TEMPLATES
lint-iac: venv-iac
	$(IAC)/bin/cfn-lint $(TEMPLATE) $(FORWARDER)
	rm -rf $(IAC_EXPANDED) && mkdir -p $(IAC_EXPANDED)
	$(IAC)/bin/python -c "$$EXPAND_TEMPLATES" $(IAC_EXPANDED) $(TEMPLATE) $(FORWARDER)
	$(IAC)/bin/checkov --quiet --compact --skip-download --framework cloudformation \
		$(foreach t,$(TEMPLATE) $(FORWARDER),-f $(IAC_EXPANDED)/$(basename $(notdir $(t))).json)

## build: the five Lambda binaries for arm64 (cargo-lambda), where infra/template.yaml expects
## them, and nothing else of the workspace (local-cloud and the tests are not deployed);
## `make build BUILD_FLAGS=--timings` adds cargo's per-crate timing report (target/cargo-timings)
FUNCTIONS := search-offerings purchase-capacity launch-workloads replace-unhealthy cleanup-expired
build: $(IAC)/.cargo-lambda
	PATH="$(abspath $(IAC))/bin:$$PATH" $(CARGO) lambda build --release --arm64 \
		--lambda-dir target/lambda $(foreach f,$(FUNCTIONS),--package $(f)) $(BUILD_FLAGS)

## deploy: one deployment, the samconfig environment ENV (default `default`): checks the
## settings and the SAM CLI, builds (make build), deploys the main stack, then its forwarders
## (deploy-forwarders). `make deploy ENV=<name> GUIDED=1` the first time asks for the
## parameters and writes them to samconfig.local.toml (ignored by git; read from then on).
## The stack is the environment's stack_name, else capacity-pilot-<ENV> (capacity-pilot for
## `default`); its region is the environment's, else AWS_REGION, else REGION=<region>.
## needs SAM CLI 1.160.0 or later: the template's SourcePrincipals guards are Fn::ForEach
## (AWS::LanguageExtensions), which older ones fail on; checked before the long build.
SAM_MIN := 1.160.0
ENV ?= default
REGION ?=
REGIONS ?=
SAMCONFIG_DIR ?=
DEPLOY = $(PYTHON) infra/deploy.py --env "$(ENV)" $(if $(REGION),--region "$(REGION)") \
	$(if $(SAMCONFIG_DIR),--config-dir "$(SAMCONFIG_DIR)") \
	$(if $(REGIONS),--regions "$(REGIONS)") $(if $(filter 1 yes true,$(CONFIRM)),--confirm)
deploy: sam-check
	@$(DEPLOY) check $(if $(GUIDED),--guided)
	$(MAKE) --no-print-directory build
	@$(DEPLOY) deploy $(if $(GUIDED),--guided)

sam-check:
	@command -v sam >/dev/null || { echo "make deploy needs the AWS SAM CLI: https://docs.aws.amazon.com/serverless-application-model/latest/developerguide/install-sam-cli.html" >&2; exit 1; }
	@v=$$(sam --version | sed -n 's/.*version \([0-9][0-9.]*\).*/\1/p'); \
	printf '%s\n%s\n' "$(SAM_MIN)" "$$v" | sort -V -C || { echo "make deploy needs SAM CLI $(SAM_MIN) or later (the template's Fn::ForEach, AWS::LanguageExtensions); this one is '$$v': upgrade it, e.g. pip install -U aws-sam-cli" >&2; exit 1; }

## deploy-forwarders: ENV's region forwarder (infra/region-forwarder.yaml), stack
## <stack>-forwarder, in each allowed region but the main stack's (REGIONS, comma list; default
## the environment's AllowedRegions, else the template's), sending to the main stack's region;
## `CONFIRM=1` asks before each change set. Builds nothing; `make deploy` runs it. Reports a
## forwarder left under the name used before 0.1.0 (capacity-pilot-forwarder).
deploy-forwarders:
	@command -v sam >/dev/null || { echo "make deploy-forwarders needs the AWS SAM CLI: https://docs.aws.amazon.com/serverless-application-model/latest/developerguide/install-sam-cli.html" >&2; exit 1; }
	@$(DEPLOY) forwarders

## destroy: removes ENV's deployment: refuses while any request is live (capacity-pilot list
## --live), deletes the forwarders and the main stack, and says what it keeps (the state
## table, retained) and how to delete that. `CONFIRM=1` lets SAM ask before each deletion.
CAPACITY_PILOT ?=
destroy: sam-check
	@cli="$(CAPACITY_PILOT)"; if [ -z "$$cli" ]; then \
		$(CARGO) build -q -p capacity-pilot-cli && \
		cli="$$($(CARGO) metadata --format-version 1 --no-deps | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')/debug/capacity-pilot"; \
	fi; $(DEPLOY) destroy --cli "$$cli"

## soak: the deterministic simulation (tests/tests/sim) over seeds FIRST..FIRST+SEEDS-1 under
## its own optimised profile (`soak`), on every core; ends with `N seeds, V violations` and
## fails on any violation not listed as a known failure in tests/tests/sim/seeds.txt.
## A failing seed prints the one command that replays it with its trace.
SEEDS ?= 2000
FIRST ?= 1
soak:
	SEEDS=$(SEEDS) FIRST=$(FIRST) $(CARGO) test --profile soak -p integration-tests --test sim -- --ignored --exact soak --nocapture

fmt:
	$(CARGO) fmt --all

## mutants: the mutation campaign over the money paths (issue 51): what
## tests/mutants/purchase.toml lists (the purchase protocol, doubt, payment tracking, the debit
## rule, the window rules that decide what runs, cleanup's orphan sweep and detector), tested by
## a reduced simulation (MUTANTS_SEEDS seeds, 200: the make-test range: every promise kept, every
## outcome of its MUST_REACH reached, which seeds 1-100 alone do not; it stops at the first
## failing seed);
## mutants-store: DynamoStore's purchase transactions (tests/mutants/store.toml), tested by the
## differential store test.
## Never part of `make test`. Both run cargo-mutants (pinned, installed under MUTANTS_ROOT) in
## place in a git worktree at MUTANTS_TREE, never in this checkout, building into a target
## directory of its own (MUTANTS_TARGET): cargo names a workspace crate's artifacts alike in both
## trees, so a shared one would hand this checkout a mutant's library as fresh (it did: the
## checkout's tests then linked a mutated Debit rule). The build profile `mutants` (Cargo.toml)
## leaves our crates unoptimised and optimises the rest once.
##
## A campaign runs at one commit: `MUTANTS_REV=<sha>` puts the worktree there (default HEAD), and
## an existing worktree is never moved to another commit unless MUTANTS_REV names it
## (tests/mutants/tree). The lists are read from the worktree, so every shard mutates the same
## ones. `SHARD=k/n` runs one shard (shards may run at different times while this checkout moves
## on); `MUTANTS_ARGS=--list` lists the mutants. Each run writes
## $(MUTANTS_OUT)/<commit>/<campaign>/<shard>/mutants.out; `make mutants-report` sums them, and
## `make mutants-again FROM=<commit>` runs what one did not catch again at a later commit.
MUTANTS_VERSION := 27.1.0
MUTANTS_ROOT ?= $(HOME)/.cache/capacity-pilot/tools
MUTANTS_BIN := $(MUTANTS_ROOT)/bin/cargo-mutants
MUTANTS_TREE ?= $(abspath ..)/capacity-pilot-mutants
MUTANTS_OUT ?= $(abspath ..)/capacity-pilot-mutants.out
MUTANTS_TARGET ?= $(HOME)/.cache/capacity-pilot/mutants-target
MUTANTS_SEEDS ?= 200
MUTANTS_TIMEOUT ?= 600
MUTANTS_REV ?=
SHARD ?=
MUTANTS_ARGS ?=
MUTANTS_SHARD_DIR = $(if $(SHARD),shard-$(subst /,-of-,$(SHARD)),all)
MUTANTS_COMMON = --in-place --no-shuffle --baseline skip --timeout $(MUTANTS_TIMEOUT) \
	--profile mutants $(if $(SHARD),--shard $(SHARD)) $(MUTANTS_ARGS)

$(MUTANTS_BIN):
	$(CARGO) install --locked --root $(MUTANTS_ROOT) cargo-mutants@$(MUTANTS_VERSION)

# The worktree, at MUTANTS_REV (default HEAD): created, or put back at its commit (an
# interrupted run's mutant discarded), or moved only to a commit MUTANTS_REV names.
mutants-tree:
	@tests/mutants/tree "$(MUTANTS_TREE)" "$(MUTANTS_REV)" >/dev/null

# Each campaign's test: the environment and the arguments after cargo-mutants' own.
MUTANTS_ENV_purchase = SEEDS=$(MUTANTS_SEEDS) FIRST=1 SOAK_REACH=1 SOAK_STOP=1
MUTANTS_TEST_purchase = --test-package integration-tests -- --test sim -- --ignored --exact soak
MUTANTS_ENV_store =
MUTANTS_TEST_store = --test-package integration-tests -- --test store_diff
# The second line for what a campaign missed (`make mutants-again AGAIN_TEST=units`): the unit
# tests of the library and of every function.
MUTANTS_ENV_extension =
MUTANTS_TEST_extension = --test-package capacity-pilot --test-package purchase-capacity \
	--test-package cleanup-expired -- --lib
MUTANTS_ENV_units =
MUTANTS_TEST_units = --test-package capacity-pilot --test-package search-offerings \
	--test-package purchase-capacity --test-package launch-workloads \
	--test-package replace-unhealthy --test-package cleanup-expired -- --lib

# $(call mutants-run,CAMPAIGN,TREE,TARGET,OUTPUT DIR (may use $$rev),CONFIG): cargo-mutants in
# TREE, put at MUTANTS_REV first.
define mutants-run
	rev=$$(tests/mutants/tree "$(2)" "$(MUTANTS_REV)") && \
	out="$(4)" && mkdir -p "$$out" && \
	cd "$(2)" && ln -sfn "$(abspath $(VENV))" .venv && \
		CARGO_TARGET_DIR="$(3)" $(MUTANTS_ENV_$(1)) "$(MUTANTS_BIN)" mutants \
		--config "$(5)" $(MUTANTS_COMMON) --output "$$out" $(MUTANTS_TEST_$(1))
endef

mutants: $(MUTANTS_BIN) venv
	$(call mutants-run,purchase,$(MUTANTS_TREE),$(MUTANTS_TARGET),$(MUTANTS_OUT)/$$rev/purchase/$(MUTANTS_SHARD_DIR),tests/mutants/purchase.toml)

## mutants-extension: the extension files' mutants (tests/mutants/extension.toml, issue 58),
## tested by the unit tests of the library, purchase-capacity and cleanup-expired.
mutants-extension: $(MUTANTS_BIN) venv
	$(call mutants-run,extension,$(MUTANTS_TREE),$(MUTANTS_TARGET),$(MUTANTS_OUT)/$$rev/extension/$(MUTANTS_SHARD_DIR),tests/mutants/extension.toml)

mutants-store: $(MUTANTS_BIN) venv
	$(call mutants-run,store,$(MUTANTS_TREE),$(MUTANTS_TARGET),$(MUTANTS_OUT)/$$rev/store/$(MUTANTS_SHARD_DIR),tests/mutants/store.toml)

## mutants-again: the mutants CAMPAIGN's run at FROM did not catch (missed, timed out), run
## again at MUTANTS_REV (default HEAD) once their answers landed, with the campaign's own test
## (AGAIN_TEST=units: with the unit tests instead), in a worktree and target directory of their
## own, so a campaign's shards can go on meanwhile (tests/mutants/again.py). Results:
## $(MUTANTS_OUT)/<commit>/<campaign>-again-from-<FROM>/<test>-<shard>/.
MUTANTS_AGAIN_TREE ?= $(MUTANTS_TREE)-again
MUTANTS_AGAIN_TARGET ?= $(MUTANTS_TARGET)-again
AGAIN_TEST ?= $(CAMPAIGN)
FROM ?=
mutants-again: $(MUTANTS_BIN) venv
	@test -n "$(FROM)" || { echo "FROM=<commit>: the campaign whose misses run again" >&2; exit 2; }
	from=$$(git rev-parse --verify "$(FROM)^{commit}") && \
	rev=$$(tests/mutants/tree "$(MUTANTS_AGAIN_TREE)" "$(MUTANTS_REV)") && \
	mkdir -p "$(MUTANTS_OUT)/$$rev/$(CAMPAIGN)-again-from-$$from" && \
	$(PYTHON) tests/mutants/again.py "$(MUTANTS_OUT)/$$from/$(CAMPAIGN)" \
		"$(MUTANTS_OUT)/$$rev/$(CAMPAIGN)-again-from-$$from/mutants.toml" && \
	$(MAKE) --no-print-directory mutants-again-run MUTANTS_REV=$$rev \
		MUTANTS_AGAIN_DIR="$(MUTANTS_OUT)/$$rev/$(CAMPAIGN)-again-from-$$from"

mutants-again-run:
	$(call mutants-run,$(AGAIN_TEST),$(MUTANTS_AGAIN_TREE),$(MUTANTS_AGAIN_TARGET),$(MUTANTS_AGAIN_DIR)/$(AGAIN_TEST)-$(MUTANTS_SHARD_DIR),$(MUTANTS_AGAIN_DIR)/mutants.toml)

## mutants-shards: every shard of CAMPAIGN (purchase or store), SHARDS of them, at MUTANTS_REV,
## that has not finished yet, one after another (tests/mutants/shards)
CAMPAIGN ?= purchase
SHARDS ?= 14
mutants-shards:
	tests/mutants/shards "$(CAMPAIGN)" "$(SHARDS)" "$(MUTANTS_OUT)" "$(MUTANTS_TREE)" "$(MUTANTS_REV)"

## mutants-report: each campaign's totals and shard times at MUTANTS_REV (default: the
## worktree's commit), and every mutant not caught
mutants-report:
	rev=$$(git rev-parse --verify "$(or $(MUTANTS_REV),$$(git -C "$(MUTANTS_TREE)" rev-parse HEAD))^{commit}") && \
	$(PYTHON) tests/mutants/report.py "$(MUTANTS_OUT)/$$rev"

# No file may carry cargo-mutants' marker (an interrupted in-place run leaves one).
no-mutants:
	@! git grep -n -I 'changed by cargo-mutants' -- ':!Makefile' || \
		{ echo "a file above carries a cargo-mutants mutation: restore it (git checkout -- <file>)" >&2; exit 1; }


## schemas: rewrite what is generated from the code: the JSON Schemas (infra/events/schemas/),
## the emitted samples (infra/events/emitted/), the request field table (docs/requests.md) and
## the errorType list (docs/operations.md); a test fails when a checked-in copy differs
schemas:
	UPDATE_SCHEMAS=1 $(CARGO) test -p capacity-pilot --test domain -- generated_ the_checked_in_schemas

## venv: the pinned Python tools the tests need (moto's DynamoDB server)
venv: $(VENV)/.installed

# moto's own dependencies are pinned too (a constraints file), so a new boto3 cannot break it.
$(VENV)/.installed: Makefile tests/support/moto-constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check \
		-c tests/support/moto-constraints.txt \
		"moto[server]==$(MOTO_VERSION)" "werkzeug==$(WERKZEUG_VERSION)"
	touch $@

venv-iac: $(IAC)/.installed

$(IAC)/.installed: Makefile tests/support/iac-constraints.txt
	$(PYTHON) -m venv $(IAC)
	$(IAC)/bin/pip install --quiet --disable-pip-version-check \
		-c tests/support/iac-constraints.txt \
		"cfn-lint==$(CFN_LINT_VERSION)" "checkov==$(CHECKOV_VERSION)"
	touch $@

# cargo-lambda (and the zig it cross-links with) only for builds, not for the tests. The zig
# wheel is pinned in the constraints file: cargo-lambda asks only for ziglang>=0.10, and zig
# 0.16.0's `ar` cannot create an archive, which breaks the cross-build of ring and aws-lc-sys
# (rust-cross/cargo-zigbuild#433, aws/aws-lc-rs#993); 0.15.2 builds both.
$(IAC)/.cargo-lambda: $(IAC)/.installed tests/support/build-constraints.txt
	$(IAC)/bin/pip install --quiet --disable-pip-version-check \
		-c tests/support/build-constraints.txt "cargo-lambda==$(CARGO_LAMBDA_VERSION)"
	touch $@

## bench: the figures of the README's "Packages, memory and cold start" in one run, never part
## of `make test`: the arm64 zips (make build); each function's release init, peak RSS, CPU
## and AWS calls per invocation, and the default scenario's wall time (x86-64 release binaries
## under the local runner, medians of BENCH_RUNS runs); one search-offerings tick's planning of
## 1,000 requests over 10,000 offerings (criterion, bench/benches/planner.rs); what TLS adds to
## a cold start's first calls, in BENCH_TLS_RUNS fresh processes (bench/benches/tls_cold_start.rs).
BENCH_RUNS ?= 5
BENCH_TLS_RUNS ?= 20
bench: build venv
	$(CARGO) build --workspace --bins --release
	@target="$$($(CARGO) metadata --format-version 1 --no-deps | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"; \
		$(PYTHON) bench/report.py --target "$$target" --lambda-dir target/lambda \
		--scenario infra/local/scenarios/default.yaml --runs $(BENCH_RUNS)
	BENCH_TLS_RUNS=$(BENCH_TLS_RUNS) $(CARGO) bench -p benches --features bench

## cost: what the deployment costs a month at the published prices of infra/costs.toml
## (us-east-1, dated there), by infra/cost.py: idle (only the schedules fire) and at the load
## of make run's invocations.jsonl scaled to a month, with a line per resource; fails naming a
## resource type of either template that costs.toml neither prices nor lists as free.
## `make cost INVOCATIONS=<file>` prices another run's log. Builds and runs nothing.
INVOCATIONS ?= $$target/capacity-pilot/invocations.jsonl
cost: venv
	@target="$$($(CARGO) metadata --format-version 1 --no-deps | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"; \
		$(VENV)/bin/python infra/cost.py --invocations "$(INVOCATIONS)" --template $(TEMPLATE) --forwarder $(FORWARDER)

## run: the whole lifecycle offline: builds the functions and plays a scenario with the real
## binaries on the local runner (local-cloud run), printing its timeline, a summary per request
## and per function, and its checks; non-zero when a check fails.
## `make run SCENARIO=<file>` plays another scenario (see infra/local/scenarios/).
## `make run PROFILE=release` runs release binaries: the memory figures to deploy with.
SCENARIO ?= infra/local/scenarios/default.yaml
PROFILE ?= debug
run: venv
	$(CARGO) build --workspace --bins $(if $(filter release,$(PROFILE)),--release)
	@target="$$($(CARGO) metadata --format-version 1 --no-deps | $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"; \
		"$$target/$(PROFILE)/local-cloud" run --bin-dir "$$target/$(PROFILE)" "$(SCENARIO)"
