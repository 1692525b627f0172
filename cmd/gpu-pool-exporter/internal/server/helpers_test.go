package server

import "github.com/gpu-pool-exporter/gpu-pool-exporter/cmd/gpu-pool-exporter/internal/servertest"

// The shared helpers of servertest under the names these tests use.
type syncBuffer = servertest.SyncBuffer

var (
	waitUntil = servertest.WaitUntil
	get       = servertest.Get
)
