package ledger_test

import (
	"encoding/json"
	"fmt"

	"github.com/actionledger/ledger/ledger"
)

// Helpers of the SQLite-specific tests of this package; the conformance
// suite (ledger/storetest) has its own.

func submitParams(key, title string) ledger.SubmitRunParams {
	return ledger.SubmitRunParams{
		Tenant: "acme", IdempotencyKey: key, Principal: "alice", Agent: "practice-cards",
		Input: json.RawMessage(fmt.Sprintf(`{"title": %q, "markdown": "# a"}`, title)),
	}
}

func deepJSON(depth int) json.RawMessage {
	s := ""
	for range depth {
		s += `{"a":`
	}
	s += "1"
	for range depth {
		s += "}"
	}
	return json.RawMessage(s)
}

func ptr[T any](v T) *T { return &v }
