package ledger

import (
	"errors"
	"fmt"
)

// ErrorCode is a stable, machine-readable class of error. The HTTP server maps
// each code to one status; callers branch on codes, never on messages.
type ErrorCode string

// Error codes returned by the ledger.
const (
	// CodeInvalid: the request is malformed or breaks a rule of the domain
	// (an illegal transition, a bad id, a malformed digest).
	CodeInvalid ErrorCode = "invalid"
	// CodeNotFound: the object does not exist (or is not visible to the caller).
	CodeNotFound ErrorCode = "not_found"
	// CodeConflict: the request is well formed but clashes with the stored
	// state: a guarded transition lost a race, an idempotency key was reused
	// with another body, a digest does not match.
	CodeConflict ErrorCode = "conflict"
	// CodeForbidden: the caller may not do this (a role it lacks, approving
	// its own run). Another tenant's object is CodeNotFound, never this.
	CodeForbidden ErrorCode = "forbidden"
	// CodeApprovalRequired: the action needs an approval it does not have.
	CodeApprovalRequired ErrorCode = "approval_required"
	// CodeApprovalStale: the action's approval passed its execute_by; an
	// attempt needs a new approval (Store.ReaskApproval asks for it).
	CodeApprovalStale ErrorCode = "approval_stale"
	// CodeBudgetExceeded: a persisted budget forbids the operation.
	CodeBudgetExceeded ErrorCode = "budget_exceeded"
	// CodeUnsupportedVersion: the database was written by a newer version.
	CodeUnsupportedVersion ErrorCode = "unsupported_version"
	// CodeInternal: anything else; details are for logs, not for clients.
	CodeInternal ErrorCode = "internal"
)

// Error is the error type of the ledger. Its Is method matches any other
// *Error with the same code, so errors.Is(err, ErrConflict) holds for every
// conflict, whatever its message.
type Error struct {
	Code    ErrorCode
	Message string
	Err     error
}

// Sentinels to match with errors.Is.
var (
	ErrInvalid            = &Error{Code: CodeInvalid, Message: "invalid"}
	ErrNotFound           = &Error{Code: CodeNotFound, Message: "not found"}
	ErrConflict           = &Error{Code: CodeConflict, Message: "conflict"}
	ErrForbidden          = &Error{Code: CodeForbidden, Message: "forbidden"}
	ErrApprovalRequired   = &Error{Code: CodeApprovalRequired, Message: "approval required"}
	ErrApprovalStale      = &Error{Code: CodeApprovalStale, Message: "approval stale"}
	ErrBudgetExceeded     = &Error{Code: CodeBudgetExceeded, Message: "budget exceeded"}
	ErrUnsupportedVersion = &Error{Code: CodeUnsupportedVersion, Message: "unsupported schema version"}
	ErrInternal           = &Error{Code: CodeInternal, Message: "internal error"}
)

// Error implements error. Message is the whole human-readable text (Errorf
// already folds the wrapped error into it).
func (e *Error) Error() string {
	switch {
	case e.Message != "":
		return e.Message
	case e.Err != nil:
		return e.Err.Error()
	default:
		return string(e.Code)
	}
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Errorf returns an *Error with the given code and a formatted message. A %w
// verb in format keeps the wrapped error reachable through Unwrap.
func Errorf(code ErrorCode, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: code, Message: err.Error(), Err: errors.Unwrap(err)}
}

// Code returns the code of the first *Error in err's chain, CodeInternal for
// any other non-nil error, and "" for nil.
func Code(err error) ErrorCode {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}
