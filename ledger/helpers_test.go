package ledger_test

import "encoding/json"

// Helpers of the tests of this package; the conformance
// suite (ledger/storetest) has its own.

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
