package ledger

import (
	"crypto/rand"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
)

// Typed identifiers. Their text form is a type prefix and a ULID, so they
// sort by creation time and say what they name: run_01J…, act_…, att_…
type (
	RunID          string
	ActionID       string
	AttemptID      string
	ApprovalID     string
	EventID        string
	ObservationID  string
	CancellationID string
)

// ID prefixes, without the underscore.
const (
	PrefixRun          = "run"
	PrefixAction       = "act"
	PrefixAttempt      = "att"
	PrefixApproval     = "apr"
	PrefixEvent        = "evt"
	PrefixObservation  = "obs"
	PrefixCancellation = "cnc"
)

// NewIDFunc returns a new identifier with the given prefix. The Store takes
// one so tests can use sequential ids (see ledgertest).
type NewIDFunc func(prefix string) string

// NewULIDFunc returns a NewIDFunc making prefixed ULIDs whose time part comes
// from now and whose entropy is monotonic within the process, so ids made in
// the same millisecond still sort in creation order.
func NewULIDFunc(now func() time.Time) NewIDFunc {
	var mu sync.Mutex
	entropy := ulid.Monotonic(rand.Reader, 0)
	return func(prefix string) string {
		mu.Lock()
		defer mu.Unlock()
		ts := ulid.Timestamp(now())
		id, err := ulid.New(ts, entropy)
		if err != nil { // monotonic overflow within one millisecond: start a fresh sequence
			entropy = ulid.Monotonic(rand.Reader, 0)
			id = ulid.MustNew(ts, entropy)
		}
		return prefix + "_" + id.String()
	}
}

// ValidID reports whether s is prefix_ followed by a well-formed ULID.
func ValidID(prefix, s string) bool {
	rest, ok := strings.CutPrefix(s, prefix+"_")
	if !ok || len(rest) != ulid.EncodedSize {
		return false
	}
	_, err := ulid.ParseStrict(rest)
	return err == nil
}
