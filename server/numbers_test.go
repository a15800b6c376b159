package server_test

import (
	"net/http"
	"strings"
	"testing"
)

// TestSubmitNumbers: a number the schema library cannot hold exactly, or
// only at great cost, is a client's mistake (400 at its location), never a
// panic answered 500 or seconds of CPU per request.
func TestSubmitNumbers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, options{})
	send := func(t *testing.T, budget string) response {
		t.Helper()
		return e.send(t, request{principal: "alice", method: http.MethodPost, path: "/v1/runs",
			body:   `{"agent":"practice-cards","input":{"title":"t","markdown":"m"},"budgets":{"max_steps":` + budget + `}}`,
			header: map[string][]string{"Idempotency-Key": {"k-" + t.Name()}}})
	}
	for name, tc := range map[string]struct{ number, msg string }{
		// big.Rat cannot parse it: the library dereferenced nil (500).
		"ErrHugeExponent":     {"1e1000001", "exponent"},
		"ErrTinyExponent":     {"1e-1000001", "exponent"},
		"ErrBeyondADouble":    {"1e400", "out of range"},
		"ErrHundredThousand9": {strings.Repeat("9", 100000), "longer than 100 characters"},
	} {
		t.Run(name, func(t *testing.T) {
			p := requireProblem(t, send(t, tc.number), http.StatusBadRequest, "schema_violation")
			requireLocation(t, p, "/budgets/max_steps", tc.msg)
		})
	}
	t.Run("OK", func(t *testing.T) {
		res := send(t, "20")
		if res.Status != http.StatusCreated {
			t.Fatalf("%d %s", res.Status, res.Body)
		}
	})
	if n := e.runCount(t); n != 1 {
		t.Fatalf("%d runs, want the one good one", n)
	}
}
