//go:build !unix

package main

// peakRSSKiB is not measured where getrusage does not exist; ledger bench
// then leaves the memory figure out.
func peakRSSKiB() (int64, bool) { return 0, false }
