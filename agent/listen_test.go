package agent_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// --web.systemd-socket serves on the socket systemd passes: a listener
// inherited as file descriptor 3 with LISTEN_FDS=1 and LISTEN_PID set to the
// exporter's own process ID, as systemd starts a service of a .socket unit.
func TestSystemdSocketActivation(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := simBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	f, err := l.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	// LISTEN_PID must name the exporter: the shell sets it to its own
	// process ID and replaces itself with the exporter.
	cmd := exec.Command("/bin/sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=gpu-pool-exporter.socket exec "$0" "$@"`,
		bin, "--web.systemd-socket", "--collect-interval=1s", "--log.level=info", "--log.format=console")
	cmd.ExtraFiles = []*os.File{f} // file descriptor 3
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The socket is the exporter's now: this process neither accepts on it
	// nor keeps it open.
	f.Close()
	l.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	c := &http.Client{Timeout: 5 * time.Second}
	var body string
	if !pollUntil(waitTimeout, func() bool {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the exporter exited (%v):\n%s", err, logs.String())
		default:
		}
		resp, err := c.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		return resp.StatusCode == 200 && strings.Contains(body, "gpu_info{")
	}) {
		t.Fatalf("no metrics on the socket systemd passed (%s); log:\n%s", addr, logs.String())
	}
	if !strings.Contains(logs.String(), "serving /metrics") || !strings.Contains(logs.String(), addr) {
		t.Errorf("the log does not say the inherited socket %s is served:\n%s", addr, logs.String())
	}
}

// --web.systemd-socket without sockets from systemd, or beside
// --web.listen-address, and a vsock address without a port, fail with what
// to do.
func TestListenErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"not started by systemd", []string{"--simulate", "--web.systemd-socket"}, exitError, "systemd passed no sockets"},
		{"with a listen address", []string{"--simulate", "--web.systemd-socket", "--web.listen-address=" + freeAddr(t)}, exitUsage, "give one of them"},
		{"vsock without a port", []string{"--simulate", "--web.listen-address=vsock://:metrics"}, exitUsage, `invalid port ":metrics" after host; want vsock://:PORT`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var errb bytes.Buffer
			if code := run(context.Background(), tc.args, io.Discard, &errb); code != tc.code || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errb.String(), tc.code, tc.want)
			}
		})
	}
}
