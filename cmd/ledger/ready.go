package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/spf13/cobra"
)

// readyPollInterval is how often ready --wait and runs show --wait-state
// ask the server again.
const readyPollInterval = 100 * time.Millisecond

func newReadyCmd() *cobra.Command {
	var (
		o    clientOptions
		wait time.Duration
	)
	cmd := &cobra.Command{
		Use:   "ready [--wait D]",
		Short: "Check that the server is ready to serve (GET /readyz), waiting for it with --wait",
		Long: `Ask the server whether it is ready: its store is reachable, its migrations are
current and its writes and run leases work. Prints "ready" and exits 0 if it is. Otherwise, and if nothing answers, exits
1 with what went wrong; with --wait D it asks again every 100ms until the server is
ready or D has passed, which is what a script needs right after starting
"ledger serve" in the background. /readyz needs no token.`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if wait < 0 {
				return usagef("--wait must not be negative")
			}
			c, err := o.newClient()
			if err != nil {
				return err
			}
			res, err := pollReady(cmd.Context(), c, wait)
			if err != nil {
				return err
			}
			if o.asJSON {
				return printJSON(cmd.OutOrStdout(), res.body)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), "ready")
			return err
		},
		Example: `  ledger serve --db ./ledger.db &
  ledger ready --wait 10s && ledger runs list
  ledger ready --server http://10.0.0.5:8080 --json`,
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "keep asking until the server is ready or this long has passed (0: ask once)")
	addClientFlags(cmd, &o)
	return cmd
}

// pollReady asks GET /readyz until it answers 200 or wait has passed.
// No request outlives the wait: a server that accepts connections and
// never answers must not hold a script past it.
func pollReady(ctx context.Context, c *client, wait time.Duration) (*response, error) {
	deadline := time.Now().Add(wait)
	var last error
	for {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if wait > 0 {
			rctx, cancel = context.WithDeadline(ctx, deadline)
		}
		res, err := c.do(rctx, request{method: http.MethodGet, path: "/readyz"})
		cut := rctx.Err() != nil
		cancel()
		if err == nil {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, err // interrupted
		}
		if last == nil || !cut {
			last = err // the last answer the deadline did not cut short
		}
		if time.Until(deadline) < readyPollInterval {
			return nil, &notReadyError{wait: wait, err: last}
		}
		if err := sleepCtx(ctx, readyPollInterval); err != nil {
			return nil, err
		}
	}
}

// sleepCtx waits d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// notReadyError is a server that was not ready in time: exit status 1,
// whatever the last answer was (a 503, or none).
type notReadyError struct {
	wait time.Duration
	err  error
}

func (e *notReadyError) Error() string {
	if e.wait == 0 {
		return fmt.Sprintf("not ready: %v", e.err)
	}
	return fmt.Sprintf("not ready after %s: %v", e.wait, e.err)
}
func (e *notReadyError) Unwrap() error { return e.err }
func (e *notReadyError) ExitCode() int { return exitOther }
