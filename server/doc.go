// Package server serves the exporter's HTTP endpoints with
// exporter-toolkit's web package (TLS, HTTP/2 settings, the configured
// headers, every listener given, systemd's sockets) inside the defences a
// node agent needs against clients that misbehave, whoever shares their
// address and whatever they mix: every resource a client can hold has a
// fixed bound, and the bounds add up (docs/security.md) to less than the
// pod's memory limit.
//
// The files, in the order a connection meets them, each using only those
// before it; Serve, which puts them together, last:
//
//	bounds.go     every hand-tuned bound of the defences, what it guards
//	              against and the bench run that sets it
//	listen.go     the listeners: --web.listen-address (TCP, vsock), systemd's
//	              sockets, the probe address; their sockets' buffers and
//	              segment size bounded from before listen(2)
//	conns.go      each listener's connection cap and the memory budget (the
//	              web listeners' and the probe listener's own), the shed order
//	              (without credentials, what makes no progress, then what
//	              serves no request or a login past its grace; then a
//	              logged-in connection that stalls; from any address, a
//	              password flood's networks before a quiet one's; from its
//	              own address, only for a connection that showed credentials
//	              or took an answer); the sockets' kernel buffers bounded;
//	              every write's deadline and progress
//	webconfig.go  --web.config.file parsed as the toolkit does, its view handed
//	              to the toolkit (TLS, headers), reloaded on change or SIGHUP
//	handlers.go   the first handler: the request charged to the budget,
//	              bodies and methods refused, every answer's write deadlines,
//	              scrape slots given back at the first write
//	auth.go       the rate limit and basic auth: accepted credentials
//	              remembered, failing addresses refused before bcrypt, a
//	              bounded bcrypt queue fair to every network and user, one
//	              slot kept from a flood for a first login; the networks'
//	              login load the shed order reads
//	errorlog.go   net/http's own error lines, rate-limited at debug level
//	server.go     Serve: one http.Server per listener with its HTTP/2 and
//	              header limits, served by exporter-toolkit's web.Serve
package server
