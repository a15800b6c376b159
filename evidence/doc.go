// Package evidence turns what the ledger recorded about a run into a
// redacted, tamper-evident report (docs/evidence.md): the run, its
// actions with their attempts (status and effect as separate facts) and
// approvals, the cancellation, the budget, recovery decisions with their
// rationale, tool-side observations, the event timeline and the verdict on
// the event hash chain.
//
// Build reads a run through ledger.Store into a Report, which mirrors the
// contract contracts.SchemaReport; JSON, Markdown and HTML render it. JSON
// is checked against the schema before a byte is written.
//
// Redaction is not optional: Build needs a Redactor, and a value that
// cannot be redacted (malformed JSON, a malformed secret path) fails the
// whole export with redact.ErrRedaction rather than showing it as recorded. A
// Redactor replaces the values at the argument paths a tool descriptor
// marks secret, strings matching well-known secret patterns (API keys,
// bearer and basic credentials, passwords in URLs, private keys, JWTs,
// key=value credentials in free text) and scalars under keys that name
// credentials, with "[redacted:<8 hex>]": the first 8 hex digits of
// HMAC-SHA256(key, secret). Equal secrets get equal markers within one key,
// so a reader can correlate them without learning them; the key's id in
// the report says which markers are comparable. Arguments of a tool whose
// secret paths the export does not know are replaced as a whole.
//
// The chain verdict in a report is the store's (ledger.Store.FindChain),
// from the same snapshot as the timeline and the rows it shows: every
// event's hash recomputed, and every row held to the newest event that
// recorded it. A report carries what a third party needs to check it
// without the database — each row's digest and the digests of what
// redaction hid, each event's bound rows, the signed chain head — and
// ReadReport and Report.Verify do that check (verify.go).
//
// It imports ledger, contracts and redact of this project, nothing else.
package evidence
