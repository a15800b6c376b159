//go:build faultmatrix_broken

package engine

import "os"

// broken reports whether this test build (go build -tags
// faultmatrix_broken) was asked, through LEDGER_BROKEN, to misbehave in one
// of the ways the fault matrix must catch:
//
//	call_before_record  call the tool before recording the attempt
//	retry_unknown       treat every tool as deduplicating, so an unknown
//	                    effect is resent instead of reviewed
//
// The tag never appears in a release build; the matrix's own test builds
// it to prove the matrix can fail.
func broken(mode string) bool { return os.Getenv("LEDGER_BROKEN") == mode }
