package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// One process per database. Every command that advances runs or recovers
// them (serve, worker, recover, demo) and migrate, which writes the schema,
// first takes an exclusive advisory lock (flock(2)) on <db>.lock, without
// waiting: a second such process on the same file would take the first
// one's call in flight for an interrupted one and run it again. The lock is
// held until the process ends; the kernel releases it however the process
// ends, SIGKILL included, so a crash never leaves a stale lock behind.
// Commands that only read (evidence export and verify, simulator effects)
// take no lock and may run beside a server.
//
// This is a process concern until runs are leased in the store: leases with
// fencing tokens will make several processes on one database safe, and
// replace this file.

// lockHolder is what the holder of a lock writes into the lock file, so
// a refused process can say who holds it.
type lockHolder struct {
	PID     int       `json:"pid"`
	Command string    `json:"command"`
	Host    string    `json:"host,omitempty"`
	Since   time.Time `json:"since"`
}

// dbLock is a held database lock.
type dbLock struct {
	f    *os.File
	path string
}

// Errors of flockExclusive.
var (
	errLockHeld        = errors.New("lock held by another open file")
	errLockUnsupported = errors.New("no flock(2) on this platform")
)

// errInUse is matched by a databaseInUseError with errors.Is.
var errInUse = errors.New("database in use by another ledger process")

// databaseInUseError refuses a command whose database another ledger
// process holds: exit status exitInUse.
type databaseInUseError struct {
	db     string
	holder *lockHolder // nil when the lock file names no holder yet
}

func (e *databaseInUseError) Error() string {
	who := "pid unknown"
	if h := e.holder; h != nil {
		who = fmt.Sprintf("pid %d", h.PID)
		if host, _ := os.Hostname(); h.Host != "" && h.Host != host {
			who += " on " + h.Host
		}
		if h.Command != "" {
			who += ", " + h.Command
		}
		if !h.Since.IsZero() {
			who += " since " + h.Since.UTC().Format(time.RFC3339)
		}
	}
	return fmt.Sprintf("database %s is in use by another ledger process (%s); stop it first: its lock, %s, is released when it exits",
		e.db, who, lockPath(e.db))
}

func (e *databaseInUseError) ExitCode() int        { return exitInUse }
func (e *databaseInUseError) Is(target error) bool { return target == errInUse }

// lockPath is the lock file of a database: beside it, named <db>.lock.
func lockPath(db string) string { return db + ".lock" }

// lockDatabase takes the exclusive lock of the database at db for command,
// without waiting: a *databaseInUseError if another process holds it. The
// lock file is created if need be and never removed: removing it would let
// a process that opened the old file and one that creates a new one both
// hold "the" lock. A database reached through a symbolic link is locked
// beside the file the link points to, so two spellings of one database
// share one lock. Warnings (no lock on this platform, holder not recorded)
// go to log.
func lockDatabase(db, command string, log *slog.Logger) (*dbLock, error) {
	real := db
	if p, err := filepath.EvalSymlinks(db); err == nil {
		real = p
	}
	path := lockPath(real)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock database %s: %w", db, err)
	}
	switch err := flockExclusive(f); {
	case errors.Is(err, errLockUnsupported):
		log.Warn("no database lock on this platform: nothing stops a second ledger process on this database; run one per database", "db", db)
	case errors.Is(err, errLockHeld):
		defer f.Close()
		return nil, &databaseInUseError{db: db, holder: readHolder(f)}
	case err != nil:
		defer f.Close()
		return nil, fmt.Errorf("lock database %s: %w", db, err)
	}
	// Ours now: say who holds it. The record is for people; the lock
	// itself is the kernel's, so failing to write it (a full disk) is no
	// reason to stop.
	host, _ := os.Hostname()
	rec, err := json.Marshal(lockHolder{PID: os.Getpid(), Command: command, Host: host, Since: time.Now().UTC()})
	if err == nil {
		if err = f.Truncate(0); err == nil {
			_, err = f.WriteAt(append(rec, '\n'), 0)
		}
	}
	if err != nil {
		log.Warn("could not record this process in the database's lock file", "lock", path, "err", err)
	}
	return &dbLock{f: f, path: path}, nil
}

// readHolder reads the holder a lock file names; nil if it names none
// (the holder has not written it yet, or it is not ours).
func readHolder(f *os.File) *lockHolder {
	data, err := io.ReadAll(io.NewSectionReader(f, 0, 4096))
	if err != nil || len(strings.TrimSpace(string(data))) == 0 {
		return nil
	}
	var h lockHolder
	if json.Unmarshal(data, &h) != nil || h.PID <= 0 {
		return nil
	}
	return &h
}

// Release gives the lock up; closing the file releases it. Safe to call on
// a nil lock and more than once.
func (l *dbLock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	return f.Close()
}
