//go:build !unix

package perf

import "time"

// ProcessCPU is not measured where getrusage does not exist.
func ProcessCPU() (time.Duration, bool) { return 0, false }
