package server

import "github.com/gpu-pool-exporter/gpu-pool-exporter/server/servertest"

// The shared helpers of servertest under the names these tests use.
type syncBuffer = servertest.SyncBuffer

var (
	waitUntil = servertest.WaitUntil
	get       = servertest.Get
)
