package mcpgw

import (
	"context"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Keys of the TokenInfo.Extra an HTTP front's token verifier fills in.
const (
	// TokenTenant is the tenant of the token's principal (TokenInfo.UserID).
	TokenTenant = "tenant"
)

// HTTPHandler serves MCP over streamable HTTP: sessions for the 2025-11-25
// revision and older, and the 2026-07-28 revision's stateless requests
// (told apart by their Mcp-Protocol-Version header; the SDK serves that
// revision only without sessions). Put it behind auth.RequireBearerToken
// with a verifier that sets TokenInfo.UserID to the principal and
// Extra[TokenTenant] to its tenant: a request without them is refused. A
// settled call's delivery is recorded when its answer is handed to the
// HTTP response.
func (g *Gateway) HTTPHandler() http.Handler {
	who := func(extra *mcp.RequestExtra) (Identity, bool) {
		return tokenIdentity(extra)
	}
	g.Warm(context.Background())
	s := g.server(who, true, nil)
	get := func(*http.Request) *mcp.Server { return s }
	sessions := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: g.log})
	stateless := mcp.NewStreamableHTTPHandler(get, &mcp.StreamableHTTPOptions{Logger: g.log, Stateless: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Mcp-Protocol-Version") >= statelessRevision {
			stateless.ServeHTTP(w, r)
			return
		}
		sessions.ServeHTTP(w, r)
	})
}

// statelessRevision is the first revision whose requests carry no session.
const statelessRevision = "2026-07-28"

// tokenIdentity is the identity a verified bearer token carries.
func tokenIdentity(extra *mcp.RequestExtra) (Identity, bool) {
	if extra == nil {
		return Identity{}, false
	}
	ti := extra.TokenInfo
	if ti == nil || ti.UserID == "" {
		return Identity{}, false
	}
	tenant, _ := ti.Extra[TokenTenant].(string)
	if tenant == "" {
		return Identity{}, false
	}
	return Identity{Tenant: tenant, Principal: ti.UserID}, true
}

// TokenInfo is what a verifier answers for a principal of a tenant.
func TokenInfo(tenant, principal string) *auth.TokenInfo {
	return &auth.TokenInfo{UserID: principal, Extra: map[string]any{TokenTenant: tenant}}
}
