// Command ledger is the CLI of the action ledger: serve, submit, approve and
// inspect runs, recover after a crash, and manage the database.
//
// main only wires the process to Main; the commands live in their own files,
// built by newRootCmd so tests can run them with their own output.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if shown := (*reportedError)(nil); !errors.As(err, &shown) {
			fmt.Fprintln(os.Stderr, "ledger:", err)
		}
		os.Exit(exitStatus(err))
	}
}
