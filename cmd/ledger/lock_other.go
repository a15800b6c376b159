//go:build !(darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd)

package main

import "os"

// flockExclusive has no flock(2) to call on this platform: it takes no lock
// and returns errLockUnsupported, which the caller logs; run one ledger
// process per database by hand here.
func flockExclusive(*os.File) error { return errLockUnsupported }
