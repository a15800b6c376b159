//go:build faultmatrix_broken

package simulator

import "os"

// broken reports whether this test build (go build -tags
// faultmatrix_broken) was asked, through LEDGER_BROKEN, to misbehave in one
// of the ways the fault matrix must catch:
//
//	no_fencing  write whatever fencing token a call carries
//
// The tag never appears in a release build; the matrix's own test builds
// it to prove the matrix can fail.
func broken(mode string) bool { return os.Getenv("LEDGER_BROKEN") == mode }
