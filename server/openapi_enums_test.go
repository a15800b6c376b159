package server_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// TestOpenAPIDocumentsCancelAndPaging holds the document to what the code
// answers: the cancellation states (too_late included) and fields, the
// approvals' paging, and the pending-approvals cap's 429.
func TestOpenAPIDocumentsCancelAndPaging(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	res := e.get(t, "", "/v1/openapi.json")
	require.Equal(t, http.StatusOK, res.Status)
	var doc struct {
		Paths map[string]map[string]struct {
			Parameters []struct {
				Name string `json:"name"`
			} `json:"parameters"`
			Responses map[string]json.RawMessage `json:"responses"`
		} `json:"paths"`
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Enum []any `json:"enum"` // strings here, numbers elsewhere
				} `json:"properties"`
				Required []string `json:"required"`
			} `json:"schemas"`
		} `json:"components"`
	}
	require.NoError(t, json.Unmarshal(res.Body, &doc))

	var states []any
	for _, s := range ledger.CancellationStates() {
		states = append(states, string(s))
	}
	c := doc.Components.Schemas["Cancellation"]
	require.Equal(t, states, c.Properties["state"].Enum)
	require.Contains(t, c.Properties, "id")
	require.Contains(t, c.Properties, "too_late_at")
	require.Contains(t, c.Required, "id")

	require.Contains(t, doc.Components.Schemas["ApprovalList"].Properties, "next_cursor")
	var params []string
	for _, p := range doc.Paths["/v1/approvals"]["get"].Parameters {
		if p.Name != "" { // a $ref: the X-Request-ID header every operation takes
			params = append(params, p.Name)
		}
	}
	require.ElementsMatch(t, []string{"state", "cursor", "limit"}, params)

	require.Contains(t, doc.Components.Schemas["Problem"].Properties["code"].Enum, server.CodeTooManyPendingApprovals)
	require.Contains(t, doc.Paths["/v1/runs"]["post"].Responses, "429")
	require.Equal(t, http.StatusTooManyRequests, server.StatusOf(server.CodeTooManyPendingApprovals))
}
