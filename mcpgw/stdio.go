package mcpgw

import (
	"context"
	"encoding/json"
	"io"

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
	s := g.server(func(*mcp.RequestExtra) (Identity, bool) { return id, true }, false)
	return s.Run(ctx, &deliveryTransport{inner: &mcp.IOTransport{Reader: in, Writer: out}, g: g})
}

// deliveryTransport records, after each answer is written, the delivery of
// the attempt it carries (its _meta MetaAttemptID).
type deliveryTransport struct {
	inner mcp.Transport
	g     *Gateway
}

func (t *deliveryTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &deliveryConn{Connection: c, g: t.g}, nil
}

type deliveryConn struct {
	mcp.Connection
	g *Gateway
}

func (c *deliveryConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := c.Connection.Write(ctx, msg); err != nil {
		return err
	}
	if resp, ok := msg.(*jsonrpc.Response); ok && resp.Error == nil && len(resp.Result) > 0 {
		var r struct {
			Meta map[string]any `json:"_meta"`
		}
		if json.Unmarshal(resp.Result, &r) == nil {
			if att, ok := r.Meta[MetaAttemptID].(string); ok && att != "" {
				c.g.delivered(ctx, ledger.AttemptID(att), nil)
			}
		}
	}
	return nil
}
