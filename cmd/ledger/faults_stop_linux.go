package main

import "syscall"

// raiseStop sends SIGSTOP to the calling thread (the caller locked it),
// which stops the whole process before the thread returns to user code.
func raiseStop() error {
	return syscall.Tgkill(syscall.Getpid(), syscall.Gettid(), syscall.SIGSTOP)
}
