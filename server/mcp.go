package server

import (
	"context"
	"fmt"
	"net/http"

	"github.com/actionledger/ledger/mcpgw"
	"github.com/labstack/echo/v4"
	"github.com/modelcontextprotocol/go-sdk/auth"
)

// The MCP gateway's streamable HTTP endpoint, /mcp, behind the API's own
// tokens: the session's principal is the token's, which must drive the
// gateway's agent (RoleAgent naming it, or admin). The API's
// authentication and rate limit run first, as on every route; the MCP
// SDK's bearer-token middleware then hands the identity to the gateway and
// keeps a session to the principal that opened it. RFC 9728 resource
// metadata is served at /.well-known/oauth-protected-resource/mcp: it names
// no authorization server, since the tokens are the API's (ledger token).

// mcpPath is where the gateway is served.
const mcpPath = "/mcp"

// mountMCP serves the gateway at /mcp, and its resource metadata.
func (s *Server) mountMCP(e *echo.Echo, gw *mcpgw.Gateway, agent string, mw ...echo.MiddlewareFunc) {
	verify := func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		id, ok := r.Context().Value(identityKey{}).(Identity)
		if !ok {
			return nil, fmt.Errorf("%w: no identity", auth.ErrInvalidToken)
		}
		if !id.drives(agent) {
			return nil, fmt.Errorf("%w: principal %s does not drive agent %s (the MCP gateway's): give its token the role agent for it", auth.ErrInvalidToken, id.Principal, agent)
		}
		return mcpgw.TokenInfo(id.Tenant, id.Principal), nil
	}
	bearer := auth.RequireBearerToken(verify, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true,
		ResourceMetadataURL: "/.well-known/oauth-protected-resource" + mcpPath})
	h := bearer(gw.HTTPHandler())
	handler := echo.WrapHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.tokens.Load() == nil && r.Header.Get("Authorization") == "" {
			// Dev mode: the API's middleware has made the caller dev.
			r.Header.Set("Authorization", "Bearer dev")
		}
		h.ServeHTTP(w, r)
	}))
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		e.Add(m, mcpPath, handler, mw...)
	}
	metadata := func(c echo.Context) error {
		r := c.Request()
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		return sendJSON(c, http.StatusOK, ResourceMetadata{Resource: scheme + "://" + r.Host + mcpPath,
			BearerMethodsSupported: []string{"header"}, ResourceName: "ledger MCP gateway"})
	}
	// HEAD beside the GET, as on every route of the API (the outermost
	// middleware drops a HEAD answer's body).
	e.GET("/.well-known/oauth-protected-resource"+mcpPath, metadata)
	e.HEAD("/.well-known/oauth-protected-resource"+mcpPath, metadata)
}
