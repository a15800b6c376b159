//go:build darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd

package main

import (
	"errors"
	"os"
	"syscall"
)

// flockExclusive takes an exclusive flock(2) on f without waiting:
// errLockHeld if another open file holds it. The lock belongs to the open
// file, so it also excludes a second open in this process, and the kernel
// drops it when the last descriptor closes, however the process ends.
func flockExclusive(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EWOULDBLOCK):
			return errLockHeld
		default:
			return &os.PathError{Op: "flock", Path: f.Name(), Err: err}
		}
	}
}
