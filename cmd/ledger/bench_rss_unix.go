//go:build unix

package main

import (
	"runtime"
	"syscall"
)

// peakRSSKiB is the peak resident set size of this process so far, in KiB:
// getrusage's ru_maxrss, which Linux reports in KiB and macOS in bytes.
func peakRSSKiB() (int64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	kib := int64(ru.Maxrss)
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		kib /= 1024
	}
	return kib, kib > 0
}
