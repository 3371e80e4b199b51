# tokenmeter — `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
BIN   := $(CURDIR)/bin
TOOLS := $(CURDIR)/.bin
DATA  ?= $(CURDIR)/data
export PATH := $(TOOLS):$(PATH):/usr/sbin

.PHONY: help
help: ## list the targets (coloured only on a terminal)
	@if [ -t 1 ]; then on='\033[36m'; off='\033[0m'; fi; \
	awk -v on="$$on" -v off="$$off" 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  %s%-16s%s %s\n", on, $$1, off, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## build meterd, meterctl, gpu-agent and meterbench into bin/
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: run
run: build ## start meterd --dev (data in ./data), replay demo traffic and GPU samples, print usage, latency and cost; Ctrl-C stops
	@scripts/run-demo.sh

.PHONY: test
test: ## every stage, even after one fails, with each stage's time and result, then a summary; fails at the end if any stage failed (STAGES="lint unit" picks some)
	@scripts/test-stages.sh

# The stages of `make test`, in its order.
.PHONY: test-stage-tools test-stage-lint test-stage-check-generated test-stage-unit test-stage-cluster test-stage-deploy test-stage-fuzz
test-stage-tools: tools
test-stage-lint: lint
test-stage-check-generated: check-generated
# unit: every go test with -race, but CLUSTER_ONLY (they run in test-cluster).
test-stage-unit:
	$(GO) test -race -count=1 -timeout 20m -skip '^($(CLUSTER_ONLY))$$' ./...
test-stage-cluster: test-cluster
# deploy: the deployment files' checks (deploy/: Helm, compose, Kubernetes types).
test-stage-deploy:
	cd deploy && $(GO) test -count=1 -timeout 10m ./...
test-stage-fuzz: fuzz

# The exactness tests of ingest, rollups and queries, run again with their
# stores in cluster mode on a two-shard ClickHouse cluster with ZooKeeper
# (docs/cluster.md). Each test migrates a database of its own on the
# cluster (about 16 s).
# Entries are package:Test1,Test2.
CLUSTER_TESTS := ./ingest:TestConsumerExactTotalsAndDLQ,TestConsumerCrashRecovery,TestGPUConsumerExactAndDLQ,TestConsumerCountsEachEventIDOnce \
	./rollup:TestLateEventsRecomputeExactlyTheirHour,TestTwoReplicasSameTotals \
	./query:TestUsageExactWithDuplicates,TestRollupHourExact,TestTrafficLongRangesExactPeaks,TestMinuteWindow,TestCostServingDimsExact,TestUsageServingDimsExact \
	./internal/adapter/chstore:TestMinuteRetention \
	./usagemetrics:TestScrapeMatchesUsage,TestDeploymentView

# Tests that run in test-cluster only, not also in the first, parallel pass
# of `make test`: TestIngestReplicasClusterExact runs four meterd and five
# ClickHouse servers, and next to other packages' servers on two cores the
# reads stayed one partition's events short for the test's two minutes
# (twice in CI, never alone); it runs on a quieter machine there, with
# -race for its own code (its meterd processes are built by the test,
# without it). TestIngestClusterEventIDCountedOnce (two meterd and the
# cluster, one event id index across shards) runs there for the same reason.
CLUSTER_ONLY := TestIngestReplicasClusterExact|TestIngestClusterEventIDCountedOnce

.PHONY: test-cluster
test-cluster: ## the exactness tests of ingest, rollups and queries in cluster mode (METER_TEST_CLUSTER=1), then CLUSTER_ONLY with -race
	@fail=""; for t in $(CLUSTER_TESTS); do \
		METER_TEST_CLUSTER=1 $(GO) test -count=1 -timeout 15m -run "^($$(echo $${t#*:} | tr , '|'))$$" "$${t%%:*}" || fail="$$fail $${t%%:*}"; \
	done; \
	$(GO) test -race -count=1 -timeout 15m -run '^($(CLUSTER_ONLY))$$' ./cmd/meterd || fail="$$fail ./cmd/meterd"; \
	if [ -n "$$fail" ]; then echo "test-cluster: failed in$$fail"; exit 1; fi

# Fuzz targets as package:FuzzName. Their seed corpora (testdata/fuzz/) also
# run as plain tests in every `go test`.
FUZZ_TARGETS := ./ingest:FuzzDecodeEvent ./ingest:FuzzDecodeGPUSample ./ingest:FuzzRowDecodeEvent ./ingest:FuzzRowDecodeGPUSample \
	./billing:FuzzParsePriceBook \
	./rollup:FuzzParseSLOSet ./api:FuzzQueryParams ./internal/safecsv:FuzzText
FUZZTIME ?= 10s

.PHONY: fuzz
fuzz: ## run each fuzz target for FUZZTIME (default 10s); a failing input is written under the package's testdata/fuzz/
	@fail=""; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} in $${t%%:*} for $(FUZZTIME)"; \
		for try in 1 2; do \
			out=$$($(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZTIME) "$${t%%:*}" 2>&1) && { echo "$$out"; break; }; \
			echo "$$out"; \
			if [ $$try = 2 ] || ! echo "$$out" | grep -q 'context deadline exceeded' || echo "$$out" | grep -q 'Failing input written'; then fail="$$fail $${t#*:}"; break; fi; \
			echo "fuzz $${t#*:}: Go 1.26's fuzz coordinator failed at -fuzztime without a failing input (golang/go#75804, fixed in Go 1.27); once more"; \
		done; \
	done; \
	if [ -n "$$fail" ]; then echo "fuzz: failed:$$fail"; exit 1; fi

.PHONY: test-short
test-short: ## go tests only, no lint or generation check
	$(GO) test -count=1 ./...
	cd deploy && $(GO) test -count=1 ./...

.PHONY: bench
bench: build ## throughput, latency and memory report (see README "Performance"), then ingest into a ClickHouse cluster with 1, 2 and 3 replicas, then OTLP ingest of GenAI spans (ingest/otlp), then one gpu-agent round of 100 engine scrapes (ingest/engine)
	$(GO) run ./cmd/meterbench
	$(GO) run ./cmd/meterbench cluster
	$(GO) test -run '^$$' -bench 'HTTPExport|GRPCExport|EndToEnd' -benchtime 600x ./ingest/otlp/
	$(GO) test -run '^$$' -bench 'ScrapeRound100' -benchtime 20x ./ingest/engine/

TOOL_PKGS := github.com/bufbuild/buf/cmd/buf google.golang.org/protobuf/cmd/protoc-gen-go \
	google.golang.org/grpc/cmd/protoc-gen-go-grpc github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway \
	github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2

.PHONY: bench-queries
bench-queries: ## query benchmark: 100M events + 52M GPU samples, rollups vs raw (takes ~40 min)
	$(GO) run ./cmd/meterbench queries --reps 20 --raw-reps 2

.PHONY: bench-billing
bench-billing: build ## billing benchmark: month close of 1,000 tenants, statement p99s, hourly export rows/s and RSS (REUSE=DIR: a cp -al copy of a `meterbench queries --keep` folder; else loads 100M events first, ~50 min)
	$(GO) run ./cmd/meterbench billing $(if $(REUSE),--reuse $(REUSE))

.PHONY: bench-hour
bench-hour: ## rollup of one hour of 1M events, 6 times 10 s apart (the rollup job's interval), with ClickHouse's time per query (~3 min)
	$(GO) run ./cmd/meterbench hour --runs 6 --pause 10s --query-log

.PHONY: bench-bombs
bench-bombs: build ## 16 MB bodies of millions of empty events or spans on every ingest path, alone and 16 at once, against meterd --dev: answers, time and meterd's peak memory (~2 min)
	$(BIN)/meterbench bombs --meterd $(BIN)/meterd

.PHONY: tools
tools: $(TOOLS)/.stamp ## build the pinned code generators (tools/go.mod)

$(TOOLS)/.stamp: tools/go.mod tools/go.sum Makefile
	cd tools && $(GO) build -o $(TOOLS)/ $(TOOL_PKGS)
	@touch $@

.PHONY: generate
generate: tools ## regenerate the Go code of proto/ (offline, pinned plugins)
	$(TOOLS)/buf generate

.PHONY: check-generated
check-generated: generate ## fail if the committed generated code differs from a fresh generation
	@git diff --exit-code -- proto/ || { echo "generated code in proto/ is stale: run make generate and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- proto/)" || { git status --porcelain -- proto/; echo "untracked generated files: run make generate and commit"; exit 1; }

.PHONY: lint
lint: tools ## buf lint and breaking check, gofmt, go vet
	$(TOOLS)/buf lint
	@if git rev-parse -q --verify HEAD~1 >/dev/null && git cat-file -e HEAD~1:buf.yaml 2>/dev/null; then \
		$(TOOLS)/buf breaking --against '.git#ref=HEAD~1'; fi
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	cd deploy && $(GO) vet ./...

.PHONY: clean
clean: ## remove build outputs (not ./data)
	rm -rf $(BIN) $(TOOLS)
