package main

import (
	"errors"
	"os"

	"github.com/actionledger/ledger/ledger"
)

// actionStoreFull is the fault plan {"action": "store_full", "while_file":
// PATH}: while PATH exists, every write of this process's ledger store (the
// engine's, the approval service's and the HTTP handlers') fails as on a
// full disk; reads still work, and so does the pool's check for approvals
// to expire, which finds none. Create the file to fill the disk and remove
// it to free it, while the process runs. It takes no point.
const actionStoreFull = "store_full"

// errDiskFull is what a write answers while the flag file exists, with
// SQLite's text for SQLITE_FULL; the store makes it CodeInternal, as it
// does a real I/O failure.
var errDiskFull = errors.New("database or disk is full (fault plan store_full)")

// storeFullFaults completes f for a store_full plan, which parseFaultPlan
// has checked: the store's write hook fails each write, after its
// statements ran and before its commit, while the flag file exists.
func storeFullFaults(f faults, plan faultPlan) faults {
	f.WriteFault = func(_ int64, at ledger.WritePoint) error {
		if at != ledger.WriteBeforeCommit {
			return nil
		}
		if _, err := os.Stat(plan.WhileFile); err != nil {
			return nil
		}
		return errDiskFull
	}
	return f
}
