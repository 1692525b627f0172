package server

import "time"

// Every hand-tuned bound of the server's defences, in one place: what each
// guards against, and the measurement that sets it (docs/performance.md,
// "Hostile clients", has each run's command and figures;
// `go build -o /tmp/bench ./scripts/bench && /tmp/bench -bin <gpu-pool-exporter-sim> -runs <run>`).
// docs/security.md adds them up against the chart's memory limit.

// Connections.
const (
	// DefaultMaxConnections is --web.max-connections' default: open
	// connections per web listener. A Prometheus keeps one per target, a
	// HA pair two; the cap bounds what 8,000 slowloris connections hold
	// (slow-conns: RSS 40 MiB at the cap).
	DefaultMaxConnections = 256

	// ProbeMaxConnections bounds the probe listener: the kubelet opens one
	// per probe (each closed after its answer).
	ProbeMaxConnections = 16

	// maxConnsPerUser bounds the connections with one user's accepted
	// credentials: past it, a login sheds that user's stalled connection
	// first, then its idle one, then one serving (from the address holding
	// the most), so a stolen password holds at most this many whatever it
	// opens
	// (stolen-password: 72 connections x 8 streams at window 0 against
	// the scraper whose password it is). A Prometheus HA pair and a person
	// with curl need a few.
	maxConnsPerUser = 16
)

// Memory, charged as it is held (conns.go): upper estimates of what Go's
// HTTP server keeps, measured by heap profile under the h2-auth attack
// (the budget full at 24 MiB charged while the live heap grew by 4.1 MiB).
const (
	connBytes    = 32 << 10  // an open connection: its goroutine, read and write buffers
	tlsConnBytes = 64 << 10  // more with TLS: record buffers, handshake and cipher state
	h2ConnBytes  = 128 << 10 // more once it speaks HTTP/2: framer (h2MaxReadFrame), HPACK tables, receive window (h2ConnReceive), write scheduler, a second goroutine
	requestBytes = 16 << 10  // a request or HTTP/2 stream being served (its goroutine and response buffer), plus its headers

	// DefaultMemoryBudget is what the web listeners may hold for their
	// clients, all of them together, credentials or not: nothing is held
	// past it. docs/security.md adds it to the rest.
	DefaultMemoryBudget = 24 << 20

	// probeMemoryBudget is the probe listener's own budget, apart from the
	// web listeners', so that nothing on the metrics port can take the
	// probes' room: its cap of connections, each with a request and its
	// headers (probeMaxHeaderBytes).
	probeMemoryBudget = ProbeMaxConnections * (connBytes + requestBytes + 2*probeMaxHeaderBytes)
)

// Kernel memory: what the kernel queues for each socket, which cgroup v2
// charges to the pod. Linux doubles what is asked for (socket(7)). Without
// a bound the send queue grows to net.ipv4.tcp_wmem's maximum (4 MiB) for
// a client that reads slowly: 300 of them pipelining /metrics held
// 817-967 MiB of send queues (slow-readers). A page of 60-400 KB still
// leaves in a few round trips: 32 KiB a round trip is 32 MB/s at 1 ms.
//
// A send queue that cannot hold two full segments stalls every answer
// that outgrows it: the client acknowledges every second full segment, or
// after its delayed-ACK timer (40 ms on Linux). Loopback's segments are
// 64 KiB, twice the doubled queue: each scrape on a kept-alive loopback
// connection (a sidecar, `kubectl port-forward`, a local Prometheus)
// waited about 42 ms instead of 1-2 ms. So the segments the exporter sends
// are at most maxSegmentBytes, four to the queue; pod networks' (1,440 or
// so, 8,900 with jumbo frames) hardly change.
const (
	sendBufferBytes    = 16 << 10 // SO_SNDBUF of every accepted connection
	receiveBufferBytes = 8 << 10  // SO_RCVBUF: requests are small; a pipeline sent ahead waits in the client
	maxSegmentBytes    = 8 << 10  // TCP_MAXSEG of the listeners: the MSS of what the exporter sends
)

// HTTP/2, per connection (Go's defaults: 250 streams, frames and receive
// windows of 1 MiB, which an attacker fills at will).
const (
	// maxStreamsPerConn: a scraper uses one at a time, and every stream
	// is a handler that a client which stops reading can keep waiting
	// (h2-auth, h2-tls: 300 connections x 8 streams).
	maxStreamsPerConn = 8
	h2MaxReadFrame    = 16 << 10 // the smallest the protocol allows: the framer's read buffer
	h2ConnReceive     = 64 << 10 // the smallest Go allows: request bodies (refused anyway) buffered per connection
	h2StreamReceive   = 16 << 10 // per stream, within the connection's
	h2HeaderTable     = 4 << 10  // HPACK tables, each way: the protocol's default
)

// Requests and answers.
const (
	// readHeaderTimeout bounds the headers of a request on the web
	// listeners, and (net/http takes the shortest timeout set) a TLS
	// handshake.
	readHeaderTimeout = 5 * time.Second
	maxHeaderBytes    = 64 << 10 // net/http answers 431 past it; charged twice per request (read and parsed)
	// No ReadTimeout or IdleTimeout: an idle keep-alive stays until the
	// connection cap or the budget needs its room (it is shed first), and
	// no request has a body to read. Either would arm Go's HTTP/2 idle
	// timer, which (Go 1.26.8, net/http's bundled HTTP/2 server) a
	// connection that ends with streams open re-arms as it closes them,
	// after serve stopped it: each such connection, with its TLS state,
	// buffers and HPACK tables, stays in memory for the whole timeout after
	// it closed (shared-scraper: 34 MiB live a minute after the attack with
	// a 2-minute IdleTimeout; TestClosedHTTP2ConnectionsAreFreed).

	// The probe listener answers the kubelet, whose probes send their
	// few headers at once and wait 1 s by default: a connection that
	// has not sent a whole request within probeHeaderTimeout goes, and
	// (one request per connection) after its answer too.
	probeHeaderTimeout  = time.Second
	probeMaxHeaderBytes = 8 << 10

	// writeStall is the longest one write of an answer may wait for the
	// client to read: a client that stops reading (a full TCP window, an
	// HTTP/2 stream held at window 0) loses its connection or stream then,
	// not at writeTimeout.
	writeStall = 5 * time.Second
	// writeTimeout bounds the whole answer, however its writes went.
	writeTimeout = 30 * time.Second
	// writeChunk is how much of an answer one write hands over, each with
	// a fresh writeStall deadline: a slow but moving client is served to
	// the end.
	writeChunk = 32 << 10

	// stallGrace and progressBytes: a connection with writes waiting that
	// has taken fewer than progressBytes in the last stallGrace makes no
	// progress (a client that stopped reading, or reads a trickle: the
	// slow-readers run reads 1 KiB every 100 ms). Counted in bytes, not
	// writes: with the small send buffer (sendBufferBytes) a trickle
	// frees room for a small write often. A scraper takes its page in
	// milliseconds.
	stallGrace    = time.Second
	progressBytes = 32 << 10

	// requestGrace: with basic auth, a login being checked (a request
	// without accepted credentials) may be pushed out by a newcomer
	// without credentials only after this; such a newcomer is refused
	// instead. A scraper's first login waits for bcrypt for less than
	// this; the flood's wait up to bcryptWait (auth-addrs).
	requestGrace = time.Second

	// refusedAgain: a request on a connection whose last request found no
	// room less than this before is refused at once, without looking for
	// room (a walk over every connection under the tracker's lock, about
	// 34 µs with 700 of them): a connection kept open after a refusal
	// (one that showed credentials or took an answer) cannot loop on
	// refusals at that cost. Below a scraper's polling interval, so that
	// each of its scrapes looks (shared-scraper polls every 100 ms).
	refusedAgain = 100 * time.Millisecond
)

// Trust: an address whose credentials were accepted within trustFor
// counts its new connections (at most trustedConns open) as having
// credentials from their accept, so that a scraper reconnecting during a
// flood of logins from other addresses is not shed before its first
// request is read (auth-addrs). At most maxTrusted addresses are
// remembered, the longest unseen forgotten first.
const (
	trustFor     = 10 * time.Minute
	trustedConns = 4
	maxTrusted   = 256
)

// Logins (auth.go).
const (
	// Failed logins per client address: a burst of failBurst, then one
	// more every failRefill, checked before bcrypt runs (auth-flood: 128
	// clients from one address, 35 µs of CPU a refused login).
	failBurst      = 5
	failRefill     = 10 * time.Second
	maxFailClients = 4096 // addresses remembered; the fullest buckets go first
	maxGoodLogins  = 64   // distinct accepted credentials remembered

	// bcrypt work waits in a bounded queue: at most bcryptQueue attempts
	// wait for a slot, each at most bcryptWait (well under Prometheus'
	// 10 s scrape timeout), the rest are refused at once with 503 and
	// Retry-After: a flood from any number of addresses costs at most the
	// slots' CPU (bcryptSlots, fewer with GOMAXPROCS below it), never a
	// queue of goroutines (auth-addrs: 60,000 addresses, 0.6 cores).
	// Attempts whose networks or user name made other attempts lately (a
	// flood's) hold at most every slot but one: the last is kept for a
	// first login from a quiet network (mixed: 60,000 addresses beside
	// other attacks). With one slot they may hold it.
	bcryptSlots      = 2
	bcryptQueue      = 16
	bcryptWait       = 2 * time.Second
	bcryptRetryAfter = 2 // seconds

	// An address that comes back within busyCooldown of an attempt turned
	// away with bcrypt busy counts as failing: a scraper asks once per
	// scrape interval (Prometheus' shortest is a second), a flood at once.
	busyCooldown = time.Second

	// Every attempt that needs bcrypt adds 1 to the load of its client's
	// networks (IPv4 /16 and /24, IPv6 /48 and /64) and of its user name;
	// loads halve every loadHalfLife, and an accepted login takes its 1
	// back. At most maxLoads are remembered, the lightest forgotten first.
	loadHalfLife = 10 * time.Second
	maxLoads     = 4096

	// addressPenalty is added to the queue rank of an attempt from an
	// address that failed recently or came back at once after being
	// turned away: as much as 256 times another attempt's load.
	addressPenalty = 8

	// netLoadMargin is how many orders of magnitude more login attempts
	// (the /16 and /24 loads' bit lengths added) a connection's networks
	// must have made than another's for it to be shed first among equals
	// (busierNetworks): a password flood's networks against a first login
	// from a network of its own (the bench's mixed run: about 10 against
	// 8), while connections from one network, the flood's and a scraper's
	// in it (auth-addrs), go by age.
	netLoadMargin = 2
)

// Logging and files.
const (
	// The HTTP server's own error lines (failed TLS handshakes, which any
	// client causes at will): at most serverErrorRate a second (burst
	// serverErrorBurst), each cut to maxLogLine bytes.
	serverErrorRate  = 5
	serverErrorBurst = 20
	maxLogLine       = 512

	// MaxWebConfigBytes bounds --web.config.file, which is read again
	// while serving: inline certificates and keys fit easily.
	MaxWebConfigBytes = 256 << 10
)
