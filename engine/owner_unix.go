//go:build unix

package engine

import (
	"errors"
	"syscall"
)

// processGone reports whether no process has pid: signal 0 checks without
// sending anything. A process that exists but is not ours (EPERM) is
// alive.
func processGone(pid int) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
