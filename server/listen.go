package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"syscall"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/mdlayher/vsock"
)

// Listeners are the sockets the exporter serves on, opened before anything
// else starts: a port in use fails at once, and with :0 the port actually
// served is known for the start-up log.
type Listeners struct {
	Web   []net.Listener
	Probe net.Listener // nil without a probe address
}

// ListenConfig says where to listen, as the flags gave it.
type ListenConfig struct {
	// Addresses are --web.listen-address: host:port for TCP,
	// vsock://:port for vsock.
	Addresses []string
	// SystemdSocket serves the sockets systemd passed (LISTEN_FDS)
	// instead of Addresses (--web.systemd-socket).
	SystemdSocket bool
	// Probe is --web.probe-address; empty: none.
	Probe string
}

// Listen opens every listener of c; on an error none stays open.
func Listen(c ListenConfig) (*Listeners, error) {
	ls := &Listeners{}
	var err error
	if c.SystemdSocket {
		ls.Web, err = systemdListeners()
	} else {
		ls.Web, err = listenAddresses(c.Addresses)
	}
	if err != nil {
		return nil, err
	}
	if c.Probe != "" {
		if ls.Probe, err = listenTCP(c.Probe); err != nil {
			ls.Close()
			return nil, fmt.Errorf("cannot listen on --web.probe-address=%s: %v", c.Probe, err)
		}
	}
	return ls, nil
}

// Close frees the sockets on an early return; after serving it does nothing.
func (ls *Listeners) Close() {
	for _, l := range ls.Web {
		l.Close()
	}
	if ls.Probe != nil {
		ls.Probe.Close()
	}
}

// systemdListeners are the listening sockets systemd passed (the socket
// unit's ListenStream= lines), in order.
func systemdListeners() ([]net.Listener, error) {
	files := activation.Files(true)
	if len(files) == 0 {
		return nil, errors.New("--web.systemd-socket: systemd passed no sockets (LISTEN_FDS and LISTEN_PID are not set for this process): " +
			"start the exporter from a .socket unit, or drop --web.systemd-socket and give --web.listen-address")
	}
	var ls []net.Listener
	for _, f := range files {
		l, err := net.FileListener(f)
		f.Close()
		if err != nil {
			for _, x := range ls {
				x.Close()
			}
			return nil, fmt.Errorf("--web.systemd-socket: file descriptor %s from systemd is not a listening socket (%v): use ListenStream= in the socket unit", f.Name(), err)
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func listenAddresses(addrs []string) ([]net.Listener, error) {
	var ls []net.Listener
	for _, a := range addrs {
		l, err := listenAddress(a)
		if err != nil {
			for _, x := range ls {
				x.Close()
			}
			return nil, err
		}
		ls = append(ls, l)
	}
	return ls, nil
}

func listenAddress(a string) (net.Listener, error) {
	if strings.HasPrefix(a, "vsock://") {
		port, err := VsockPort(a)
		if err != nil {
			return nil, err
		}
		l, err := vsock.Listen(port, nil)
		if err != nil {
			return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: %w (does this machine have a vsock device?)", a, err)
		}
		return l, nil
	}
	l, err := listenTCP(a)
	if err == nil {
		return l, nil
	}
	if errors.Is(err, syscall.EADDRINUSE) {
		_, port, _ := net.SplitHostPort(a)
		return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: port %s is already in use by another process "+
			"(which would answer your requests instead); choose a free port with --web.listen-address, e.g. --web.listen-address=:%s", a, port, otherPort(port))
	}
	return nil, fmt.Errorf("cannot listen on --web.listen-address=%s: %w", a, err)
}

// VsockPort is the port of a --web.listen-address of the form
// vsock://:PORT (exporter-toolkit's).
func VsockPort(a string) (uint32, error) {
	bad := func(why string) error { return fmt.Errorf("--web.listen-address=%s: %s; want vsock://:PORT", a, why) }
	u, err := url.Parse(a)
	if err != nil {
		return 0, bad(err.Error())
	}
	_, p, err := net.SplitHostPort(u.Host)
	if err != nil {
		return 0, bad(err.Error())
	}
	port, err := strconv.ParseUint(p, 10, 32)
	if err != nil {
		return 0, bad(fmt.Sprintf("port %q is not a number", p))
	}
	return uint32(port), nil
}

// otherPort suggests the next port up, for the port-in-use message.
func otherPort(port string) string {
	if n, err := strconv.Atoi(port); err == nil && n > 0 && n < 65535 {
		return strconv.Itoa(n + 1)
	}
	return "9948"
}

// listenTCP listens on a with the accepted connections' socket options
// (boundSocketOptions) set before listen(2): a connection completed by the
// kernel before the exporter starts serving (a scraper polling /readyz
// from the exporter's start) has them from its handshake too.
func listenTCP(a string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(boundSocketOptions)
	}}
	return lc.Listen(context.Background(), "tcp", a)
}

// boundSocketOptions sets a listening socket's send and receive buffers
// and its segment size clamp (bounds.go), which Linux copies into the
// connections it accepts for it; listenTCP sets them before listen(2),
// boundListenerBuffers (conns.go) on every listener, systemd's sockets
// too.
func boundSocketOptions(fd uintptr) {
	_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, sendBufferBytes)
	_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, receiveBufferBytes)
	_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_MAXSEG, maxSegmentBytes)
}
