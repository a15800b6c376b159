//go:build unix && !linux

package main

import "syscall"

// raiseStop sends SIGSTOP to the process.
func raiseStop() error { return syscall.Kill(syscall.Getpid(), syscall.SIGSTOP) }
