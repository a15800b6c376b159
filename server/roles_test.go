package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRoles walks every route with every role: a role that may not do
// something gets 403 forbidden before any object is looked at; a role
// that may gets anything but 403.
func TestRoles(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	run, a1 := e.awaiting(t, "alice", "k1")
	_, a2 := e.awaiting(t, "alice", "k2")
	r, act1, act2 := "/v1/runs/"+string(run), "/v1/actions/"+string(a1.ID), "/v1/actions/"+string(a2.ID)

	// In order: writes by the allowed come after the refusals they would
	// change.
	for _, tc := range []struct {
		who, method, path, body string
		allowed                 bool
	}{
		{"alice", http.MethodPost, "/v1/runs", "submit", true},
		{"root", http.MethodPost, "/v1/runs", "submit", true},
		{"bob", http.MethodPost, "/v1/runs", "submit", false},
		{"carol", http.MethodPost, "/v1/runs", "submit", false},

		{"alice", http.MethodGet, "/v1/runs", "", true},
		{"bob", http.MethodGet, "/v1/runs", "", true},
		{"carol", http.MethodGet, "/v1/runs", "", true},
		{"root", http.MethodGet, "/v1/runs", "", true},

		{"alice", http.MethodGet, r, "", true},
		{"bob", http.MethodGet, r, "", true},
		{"carol", http.MethodGet, r, "", true},
		{"root", http.MethodGet, r, "", true},

		{"alice", http.MethodGet, r + "/timeline", "", true},
		{"bob", http.MethodGet, r + "/timeline", "", false},
		{"carol", http.MethodGet, r + "/timeline", "", true},
		{"root", http.MethodGet, r + "/timeline", "", true},

		{"alice", http.MethodGet, r + "/evidence", "", false},
		{"bob", http.MethodGet, r + "/evidence", "", false},
		{"carol", http.MethodGet, r + "/evidence", "", true},
		{"root", http.MethodGet, r + "/evidence", "", true},

		{"alice", http.MethodGet, "/v1/approvals", "", false},
		{"bob", http.MethodGet, "/v1/approvals", "", true},
		{"carol", http.MethodGet, "/v1/approvals", "", true},
		{"root", http.MethodGet, "/v1/approvals", "", true},

		{"alice", http.MethodGet, act1, "", true},
		{"bob", http.MethodGet, act1, "", true},
		{"carol", http.MethodGet, act1, "", true},
		{"root", http.MethodGet, act1, "", true},

		{"alice", http.MethodPost, act1 + "/resolve", `{"outcome":"abandon"}`, false},
		{"carol", http.MethodPost, act1 + "/resolve", `{"outcome":"abandon"}`, false},
		{"bob", http.MethodPost, act1 + "/resolve", `{"outcome":"abandon"}`, true},  // 409: not in review
		{"root", http.MethodPost, act1 + "/resolve", `{"outcome":"abandon"}`, true}, // 409: not in review

		{"alice", http.MethodPost, act1 + "/approve", digestBody(a1.ActionDigest), false},
		{"carol", http.MethodPost, act1 + "/approve", digestBody(a1.ActionDigest), false},
		{"bob", http.MethodPost, act1 + "/approve", digestBody(a1.ActionDigest), true},
		{"alice", http.MethodPost, act2 + "/deny", digestBody(a2.ActionDigest), false},
		{"carol", http.MethodPost, act2 + "/deny", digestBody(a2.ActionDigest), false},
		{"root", http.MethodPost, act2 + "/deny", digestBody(a2.ActionDigest), true},

		{"bob", http.MethodPost, r + "/cancel", `{}`, false},
		{"carol", http.MethodPost, r + "/cancel", `{}`, false},
		{"alice", http.MethodPost, r + "/cancel", `{}`, true},
		{"root", http.MethodPost, r + "/cancel", `{}`, true},
	} {
		var res response
		if tc.body == "submit" {
			res = e.submitRaw(t, tc.who, "roles-"+tc.who, submitBody(t))
		} else {
			res = e.send(t, request{principal: tc.who, method: tc.method, path: tc.path, body: tc.body})
		}
		if tc.allowed {
			require.NotEqual(t, http.StatusForbidden, res.Status, "%s %s %s: %s", tc.who, tc.method, tc.path, res.Body)
			if res.Status >= 400 {
				require.Contains(t, []int{http.StatusConflict}, res.Status,
					"%s %s %s: %s", tc.who, tc.method, tc.path, res.Body)
			}
		} else {
			requireProblem(t, res, http.StatusForbidden, "forbidden")
		}
	}
}
