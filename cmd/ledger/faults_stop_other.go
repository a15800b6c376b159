//go:build !unix

package main

import "errors"

// raiseStop cannot stop a process where there is no SIGSTOP.
func raiseStop() error { return errors.New("this system has no SIGSTOP") }
