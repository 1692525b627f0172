# The README's two commands: `make run` and `make test`.
export CGO_ENABLED := 1
# go-nvml's cgo code prints ~150 lines of deprecation warnings without this;
# flags of your own in CGO_CFLAGS are kept.
export CGO_CFLAGS := $(strip $(filter-out -Wno-deprecated-declarations,$(CGO_CFLAGS)) -Wno-deprecated-declarations)
export PATH := $(shell go env GOPATH)/bin:$(PATH)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/prometheus/common/version.Version=$(VERSION) -X github.com/prometheus/common/version.Revision=$(REVISION)

.PHONY: test tools vet build run bench generate

## test: everything CI runs: tools, vet, gofmt, race tests (unit, promtool, helm, end to end)
test: tools vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	go test -race -count=1 ./...

tools:
	./scripts/install-tools.sh

vet:
	go vet ./...

build:
	go build -ldflags "$(LDFLAGS)" -o gpu-pool-exporter ./cmd/gpu-pool-exporter

## run: build the exporter, then run it on a simulated node (Ctrl-C stops it); ARGS="--web.listen-address=:9948" adds flags
# exec: the process is the exporter itself, not a shell or `go run` above it,
# so Ctrl-C and kill reach it.
run:
	@go build -ldflags "$(LDFLAGS)" -o gpu-pool-exporter ./cmd/gpu-pool-exporter
	@exec ./gpu-pool-exporter --simulate --log.format=console $(ARGS)

## bench: Go benchmarks and a load run against --simulate; prints one table
bench:
	./scripts/bench.sh
