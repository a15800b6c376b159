package mcpgw

import (
	"context"
	"encoding/json"
	"io"
	"sync"

	"github.com/actionledger/ledger/ledger"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ServeStdio serves one MCP client over in and out (ledger mcp: the
// process's stdin and stdout) as id, until the client closes in or ctx
// ends. A settled call's outcome is recorded as delivered once its answer
// has been written to out, not before: a gateway killed in between answers
// the client's repeated call from the record instead of calling again.
func (g *Gateway) ServeStdio(ctx context.Context, id Identity, in io.ReadCloser, out io.WriteCloser) error {
	g.Warm(ctx)
	t := &deliveryTransport{inner: &mcp.IOTransport{Reader: in, Writer: out}, g: g}
	s := g.server(func(*mcp.RequestExtra) (Identity, bool) { return id, true }, false, t.settle)
	return s.Run(ctx, t)
}

// deliveryTransport records, after each answer is written, the delivery of
// the attempt it carries (its _meta MetaAttemptID).
type deliveryTransport struct {
	inner mcp.Transport
	g     *Gateway
	// recording is read-held while an answer is written and its delivery
	// recorded: taken before the write, so the client's next call, which
	// can only follow the write, waits for the record (settle).
	recording sync.RWMutex
}

// settle waits until every delivery being recorded is.
func (t *deliveryTransport) settle() {
	t.recording.Lock()
	defer t.recording.Unlock()
}

func (t *deliveryTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &deliveryConn{Connection: c, t: t}, nil
}

type deliveryConn struct {
	mcp.Connection
	t *deliveryTransport
}

func (c *deliveryConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	att := attemptOf(msg)
	if _, due := c.t.g.toDeliver.LoadAndDelete(att); att == "" || !due {
		return c.Connection.Write(ctx, msg)
	}
	c.t.recording.RLock()
	defer c.t.recording.RUnlock()
	if err := c.Connection.Write(ctx, msg); err != nil {
		return err
	}
	c.t.g.delivered(ctx, att, nil)
	return nil
}

// attemptOf is the attempt whose outcome a message answers, "" for any
// other message.
func attemptOf(msg jsonrpc.Message) ledger.AttemptID {
	resp, ok := msg.(*jsonrpc.Response)
	if !ok || resp.Error != nil || len(resp.Result) == 0 {
		return ""
	}
	var r struct {
		Meta map[string]any `json:"_meta"`
	}
	if json.Unmarshal(resp.Result, &r) != nil {
		return ""
	}
	att, _ := r.Meta[MetaAttemptID].(string)
	return ledger.AttemptID(att)
}
