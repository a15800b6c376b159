package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"

	"github.com/actionledger/ledger/ledger"
)

// SQLSTATEs the driver tells apart (PostgreSQL's errcodes appendix).
const (
	sqlstateUniqueViolation      = "23505"
	sqlstateForeignKeyViolation  = "23503"
	sqlstateCheckViolation       = "23514"
	sqlstateNotNullViolation     = "23502"
	sqlstateSerializationFailure = "40001"
	sqlstateDeadlockDetected     = "40P01"
	sqlstateDataExceptionClass   = "22"
	// sqlstateIdleInTransactionTimeout ends a session that sat in a
	// transaction past idle_in_transaction_session_timeout.
	sqlstateIdleInTransactionTimeout = "25P03"
)

// wrapErr is the one place an error becomes the *ledger.Error the driver
// returns, with op as its context and the cause kept for errors.Is/As. It
// reads the SQLSTATE of a *pgconn.PgError wherever it sits in the chain, so
// an error raised through GORM, database/sql or pgx translates the same.
func wrapErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var e *ledger.Error
	if errors.As(err, &e) {
		return &ledger.Error{Code: e.Code, Message: op + ": " + err.Error(), Err: err}
	}
	code, what := classify(err)
	return &ledger.Error{Code: code, Message: op + ": " + what, Err: err}
}

// classify maps an error that is not yet a *ledger.Error to its code and
// the words that say why.
func classify(err error) (ledger.ErrorCode, string) {
	var pg *pgconn.PgError
	switch {
	case errors.As(err, &pg):
		switch {
		case pg.Code == sqlstateUniqueViolation:
			return ledger.CodeConflict, "already exists: " + pg.Error()
		case pg.Code == sqlstateForeignKeyViolation:
			return ledger.CodeInvalid, "refers to a missing object: " + pg.Error()
		case pg.Code == sqlstateCheckViolation, pg.Code == sqlstateNotNullViolation,
			strings.HasPrefix(pg.Code, sqlstateDataExceptionClass):
			return ledger.CodeInvalid, "invalid value: " + pg.Error()
		case retryable(err):
			return ledger.CodeConflict, "a concurrent write changed what this one read: " + pg.Error()
		}
		return ledger.CodeInternal, pg.Error()
	case errors.Is(err, gorm.ErrRecordNotFound), errors.Is(err, sql.ErrNoRows):
		return ledger.CodeNotFound, "not found"
	}
	return ledger.CodeInternal, err.Error()
}

// hasSQLState reports whether err's chain holds a PostgreSQL error with
// SQLSTATE code.
func hasSQLState(err error, code string) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == code
}

// retryable reports whether err is PostgreSQL's verdict that the
// transaction lost to a concurrent one and may succeed if run again: a
// serialisation failure or a deadlock.
func retryable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == sqlstateSerializationFailure || pg.Code == sqlstateDeadlockDetected)
}

// notFound is the CodeNotFound of a Get whose row does not exist.
func notFound(format string, args ...any) error {
	return ledger.Errorf(ledger.CodeNotFound, format, args...)
}

// sessionLost reports whether err says the session ended under the
// statement: the server ended it (a FATAL error, such as the
// idle_in_transaction_session_timeout a process frozen mid-write meets,
// or an administrator's or a shutdown's termination, SQLSTATE 57P0x), the
// connection broke (class 08; an EOF or a reset where an answer should
// have been, from a server that crashed or a proxy that was restarted;
// pgx closes such a connection), or the driver found it closed before it
// sent anything (pgconn.SafeToRetry, database/sql's ErrBadConn). A
// timeout or a cancellation is the caller's, never a lost session.
// PostgreSQL rolls back a transaction whose session ends before COMMIT,
// so a write that failed so may be run again on a new session, and a read
// always may.
func sessionLost(err error) bool {
	if pgconn.Timeout(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Severity == "FATAL" || pg.Severity == "PANIC" || strings.HasPrefix(pg.Code, "08") ||
			strings.HasPrefix(pg.Code, "57P")
	}
	return errors.Is(err, driver.ErrBadConn) || pgconn.SafeToRetry(err) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
