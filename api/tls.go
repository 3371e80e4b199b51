package api

import (
	"context"
	"crypto/tls"
	"net"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// The REST gateway reaches the gRPC server through an in-process listener,
// not the network: it needs no certificate of its own (with mutual TLS it
// would need a client certificate), and no port is open that skips TLS.
// Requests arrive there only from the gateway, after the HTTP listener's
// TLS.

// inProcess is the gRPC server's second listener, for the gateway.
type inProcess struct {
	*bufconn.Listener
}

// inProcessBuffer is the buffer of each direction of an in-process
// connection.
const inProcessBuffer = 1 << 20

func newInProcess() *inProcess { return &inProcess{bufconn.Listen(inProcessBuffer)} }

// Accept marks the connections as in-process, for serverCreds.
func (l *inProcess) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return inProcessConn{c}, nil
}

// dial is the gateway client's dialer.
func (l *inProcess) dial(ctx context.Context, _ string) (net.Conn, error) {
	return l.DialContext(ctx)
}

// gatewayDialOptions connect the gateway's client to l.
func (l *inProcess) gatewayDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithContextDialer(l.dial), grpc.WithTransportCredentials(insecure.NewCredentials())}
}

// gatewayTarget is the gateway client's target; the dialer ignores it.
const gatewayTarget = "passthrough:///in-process"

type inProcessConn struct{ net.Conn }

// serverCreds is TLS with cfg on the network listener and none on the
// in-process one; with cfg nil, none on both.
func serverCreds(cfg *tls.Config) credentials.TransportCredentials {
	if cfg == nil {
		return insecure.NewCredentials()
	}
	return splitCreds{TransportCredentials: credentials.NewTLS(cfg)}
}

type splitCreds struct {
	credentials.TransportCredentials
}

func (c splitCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if _, ok := conn.(inProcessConn); ok {
		return insecure.NewCredentials().ServerHandshake(conn)
	}
	return c.TransportCredentials.ServerHandshake(conn)
}

func (c splitCreds) Clone() credentials.TransportCredentials {
	return splitCreds{TransportCredentials: c.TransportCredentials.Clone()}
}

// httpTLS is cfg for the HTTP listener: HTTP/2 or HTTP/1.1.
func httpTLS(cfg *tls.Config) *tls.Config {
	c := cfg.Clone()
	for _, p := range []string{"h2", "http/1.1"} {
		if !slices.Contains(c.NextProtos, p) {
			c.NextProtos = append(c.NextProtos, p)
		}
	}
	return c
}
