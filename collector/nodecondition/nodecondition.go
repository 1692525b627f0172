// Package nodecondition keeps one condition on the exporter's own Node
// (--node-condition): true while a GPU has a fatal fault the exporter sees
// (state.Fault: an XID that needs a reset or a reboot, a GPU lost or hung,
// row remapping failed, a recovery action), false otherwise, so that a
// remediator (NVSentinel's kubernetes-object-monitor, node-problem-detector
// rules, an autoscaler's health check) can act on what only the exporter
// sees.
//
// It writes the node's status subresource with a strategic-merge patch of
// its own condition alone (conditions merge by type: the kubelet's and
// other components' stay as they are), as node-problem-detector does; the
// RBAC it needs is patch on nodes/status and nothing else: it never reads
// the node. It writes when the condition changes and every Heartbeat
// otherwise; conflicts, throttling and server errors are retried, and
// while the API server is away the exporter serves on and the writer tries
// again with backoff.
package nodecondition

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gpu-pool-exporter/gpu-pool-exporter/collector/state"
	"github.com/gpu-pool-exporter/gpu-pool-exporter/kubeapi"
)

// DefaultType is the condition's type unless --node-condition.type names
// another.
const DefaultType = "GPUPoolExporterFault"

// ReasonNoFault is the condition's reason while no GPU has a fatal fault.
const ReasonNoFault = "NoGPUFault"

// maxMessage bounds the condition's message (node-problem-detector and
// NVSentinel cut theirs too): a node of 8 GPUs with every fault fits.
const maxMessage = 1024

// DefaultHeartbeat is how often an unchanged condition is written again
// (its lastHeartbeatTime; a condition someone removed comes back).
const DefaultHeartbeat = 5 * time.Minute

// Config configures a Writer.
type Config struct {
	// Client talks to the API server (RBAC: patch nodes/status).
	Client *kubeapi.Client
	// NodeName is the exporter's own node, the only one it writes.
	NodeName string
	// Type is the condition type (default DefaultType).
	Type string
	// Heartbeat (default DefaultHeartbeat); BackoffMin and BackoffMax
	// bound the wait after a failed write (default 1s and 30s).
	Heartbeat, BackoffMin, BackoffMax time.Duration
	Log                               zerolog.Logger
	// Now is the clock of the condition's times (nil: time.Now).
	Now func() time.Time
}

// Condition is the node condition as written (core/v1 NodeCondition).
type Condition struct {
	Type               string `json:"type"`
	Status             string `json:"status"`
	Reason             string `json:"reason"`
	Message            string `json:"message"`
	LastHeartbeatTime  string `json:"lastHeartbeatTime"`
	LastTransitionTime string `json:"lastTransitionTime"`
}

// Writer keeps the condition on the node.
type Writer struct {
	cfg  Config
	wake chan struct{}

	mu sync.Mutex
	// want is the condition the last sample asks for (status, reason,
	// message; no times).
	want *Condition
	// written is the condition as last written with success.
	written *Condition
	// failing is the last write's error ("" after a success).
	failing  string
	duration time.Duration
}

// New checks cfg and builds the writer; Run starts it.
func New(cfg Config) (*Writer, error) {
	if cfg.Client == nil {
		return nil, errors.New("nodecondition: the node condition needs an API server client")
	}
	if cfg.NodeName == "" {
		return nil, errors.New("the node condition (--node-condition) is written on the exporter's own node: give --node-name (the chart sets NODE_NAME from spec.nodeName)")
	}
	if cfg.Type == "" {
		cfg.Type = DefaultType
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.BackoffMin <= 0 {
		cfg.BackoffMin = time.Second
	}
	if cfg.BackoffMax < cfg.BackoffMin {
		cfg.BackoffMax = max(30*time.Second, cfg.BackoffMin)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Writer{cfg: cfg, wake: make(chan struct{}, 1)}, nil
}

// Desired is the condition the faults ask for: True with the first
// fault's reason (and how many more) and every fault in the message, or
// False.
func Desired(typ string, faults []state.Fault) Condition {
	if len(faults) == 0 {
		return Condition{Type: typ, Status: "False", Reason: ReasonNoFault, Message: "No GPU of this node has a fatal fault that gpu-pool-exporter sees."}
	}
	reason := faults[0].Reason()
	if n := len(faults) - 1; n > 0 {
		reason += fmt.Sprintf("And%dMore", n)
	}
	msgs := make([]string, len(faults))
	for i, f := range faults {
		msgs[i] = f.Message()
	}
	msg := strings.Join(msgs, "; ")
	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage-3], "") + "..."
	}
	return Condition{Type: typ, Status: "True", Reason: reason, Message: msg}
}

// Observe takes a sample's state: the condition it asks for is written by
// Run. It never blocks (the sampling loop calls it).
func (w *Writer) Observe(st *state.State) {
	c := Desired(w.cfg.Type, st.Faults)
	w.mu.Lock()
	changed := w.want == nil || !same(*w.want, c)
	w.want = &c
	w.mu.Unlock()
	if changed {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

func same(a, b Condition) bool {
	return a.Type == b.Type && a.Status == b.Status && a.Reason == b.Reason && a.Message == b.Message
}

// CollectorStatus is the writer's health on the page (collector
// node_condition): down while its last write failed.
func (w *Writer) CollectorStatus() state.CollectorStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return state.CollectorStatus{Name: "node_condition", Up: w.failing == "", Duration: w.duration}
}

// Written is the condition as last written with success (nil: none yet).
func (w *Writer) Written() *Condition {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.written == nil {
		return nil
	}
	c := *w.written
	return &c
}

// Run writes the condition the samples ask for until ctx is done: at once
// when it changes, every Heartbeat otherwise, again with backoff after a
// failure.
func (w *Writer) Run(ctx context.Context) {
	backoff := w.cfg.BackoffMin
	var retry <-chan time.Time
	heartbeat := time.NewTicker(w.cfg.Heartbeat)
	defer heartbeat.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-heartbeat.C:
		case <-retry:
		}
		retry = nil
		w.mu.Lock()
		want := w.want
		w.mu.Unlock()
		if want == nil {
			continue // no sample yet
		}
		err := w.write(ctx, *want)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			wait := backoff/2 + rand.N(backoff/2+1) //nolint:gosec // jitter, not a secret
			backoff = min(2*backoff, w.cfg.BackoffMax)
			retry = time.After(wait)
			continue
		}
		backoff = w.cfg.BackoffMin
	}
}

// maxConflicts is how many times one write is tried again at once after a
// 409 Conflict (the node changed under the patch).
const maxConflicts = 5

// write patches the node's status with the condition; a conflict is
// tried again at once, a few times.
func (w *Writer) write(ctx context.Context, want Condition) error {
	start := time.Now()
	w.mu.Lock()
	prev := w.written
	w.mu.Unlock()
	now := w.cfg.Now().UTC().Format(time.RFC3339)
	c := want
	c.LastHeartbeatTime, c.LastTransitionTime = now, now
	if prev != nil && prev.Status == want.Status {
		// The status did not change since it was last written: its
		// transition stays when it was.
		c.LastTransitionTime = prev.LastTransitionTime
	}
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []Condition{c}}})
	if err != nil {
		return err
	}
	path := "/api/v1/nodes/" + url.PathEscape(w.cfg.NodeName) + "/status"
	for attempt := 0; ; attempt++ {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err = w.cfg.Client.Patch(wctx, path, kubeapi.StrategicMergePatch, patch, nil)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		retriable := kubeapi.IsStatus(err, http.StatusConflict) || kubeapi.IsStatus(err, http.StatusTooManyRequests) ||
			kubeapi.IsStatus(err, http.StatusInternalServerError) || kubeapi.IsStatus(err, http.StatusServiceUnavailable) || kubeapi.IsStatus(err, http.StatusGatewayTimeout)
		if !retriable || attempt >= maxConflicts {
			break
		}
		w.cfg.Log.Debug().Err(err).Int("attempt", attempt+1).Msg("writing the node condition: trying again")
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50*(attempt+1)) * time.Millisecond):
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.duration = time.Since(start)
	if err != nil {
		msg := err.Error()
		if msg != w.failing {
			w.cfg.Log.Warn().Err(err).Str("node", w.cfg.NodeName).Str("condition", w.cfg.Type).
				Msg("writing the node condition failed (RBAC: patch nodes/status); the exporter serves on and tries again")
		}
		w.failing = msg
		return err
	}
	if w.failing != "" || w.written == nil || !same(*w.written, c) {
		w.cfg.Log.Info().Str("node", w.cfg.NodeName).Str("condition", w.cfg.Type).Str("status", c.Status).Str("reason", c.Reason).Str("message", c.Message).
			Msg("node condition written")
	}
	w.failing = ""
	w.written = &c
	return nil
}
