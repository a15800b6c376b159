# ledger — build, test, lint, bench. `make test` is what CI runs.
GO          ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BIN         := bin/ledger
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)

.PHONY: build test test-python test-typescript lint bench bench-smoke fmt

build:
	$(GO) build -ldflags "-X main.Version=$(VERSION)" -o $(BIN) ./cmd/ledger

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# The test command of the README and of CI: lint, then every test with the
# race detector and, in the same test binaries, every benchmark once so it
# cannot rot (a separate `go test -bench` would compile every test binary a
# second time, without -race), beside the two clients and the MCP gateway's
# Node tests: those wait on npm and on servers more than they compute, so
# they run while the Go tests do (output kept per target). It runs the
# whole fault matrix once (faultmatrix.TestMatrix); LEDGER_FAULTMATRIX_REPORT=FILE
# keeps its report. `go vet ./...` ran in lint with every check, so go
# test's own vet pass (a subset, on the race build) is off.
test: lint
	$(MAKE) -j4 --output-sync=target test-go test-python test-typescript test-mcp

.PHONY: test-go
test-go:
	$(GO) test -race -vet=off -count=1 -timeout 25m -bench . -benchtime 1x ./...

# The Python client and the Python example agent, against the real binary
# (standard library only: python3 >= 3.9, nothing to install).
PYTHON ?= python3
test-python: build
	cd clients/python && LEDGER_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m unittest discover -s tests -t tests
	LEDGER_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m unittest discover -s examples/python-agent -t examples/python-agent

# The TypeScript client and the example agent, tested against the real
# binary (bin/ledger); needs node (18 or later) and npm.
test-typescript: build
	cd clients/typescript && npm ci --no-audit --no-fund && npm test
	cd examples/typescript-agent && npm ci --no-audit --no-fund && npm test

# The MCP gateway (ledger mcp over stdio, /mcp on ledger serve) under the
# official TypeScript MCP clients (@modelcontextprotocol/sdk 1.x and
# @modelcontextprotocol/client 2.x) and server-everything as an upstream,
# installed from mcpgw/e2e/package-lock.json; needs node (20.10 or later).
.PHONY: test-mcp
test-mcp: build
	cd mcpgw/e2e && npm ci --no-audit --no-fund && LEDGER_BIN=$(CURDIR)/$(BIN) npm test

# The benchmarks once each, without the tests (`make test` runs them too).
bench-smoke:
	$(GO) test -run '^$$' -bench . -benchtime 1x ./...

# Real figures: see the closing notes and BENCHMARKS.md for how to read them.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 3s -count 3 ./...

fmt:
	gofmt -w $$(git ls-files '*.go')
