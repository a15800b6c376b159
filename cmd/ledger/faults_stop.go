package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/actionledger/ledger/simulator"
)

// actionStop is the fault plan {"point": P, "action": "stop"}: at the point
// the process freezes itself with SIGSTOP, as a process its host paused
// (a VM migrated, a laptop lid closed, a debugger attached) would be, and
// carries on from there once it gets SIGCONT. Its run leases lapse while
// it is frozen; the fault matrix lets another process take its runs over,
// then wakes it, and checks that none of what it still does is applied.
const actionStop = "stop"

// stopTimeout bounds the wait for the effect store to be idle.
const stopTimeout = 30 * time.Second

// stopSelf freezes the process. It first waits until nothing of the
// process uses the simulator's effect store (effects, if not nil), and
// stays frozen holding it so: a process frozen inside one of the store's
// transactions would hold the file's write lock, and every other process
// sharing the file would stall on it. It raises the signal on its own
// thread, so that the stop takes hold before this goroutine goes on.
func stopSelf(effects *simulator.EffectStore) {
	freeze := func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		fmt.Fprintf(os.Stderr, `{"level":"WARN","msg":"fault plan: this process stops itself (SIGSTOP) until it gets SIGCONT","pid":%d}`+"\n", os.Getpid())
		if err := raiseStop(); err != nil {
			fmt.Fprintf(os.Stderr, `{"level":"ERROR","msg":"fault plan: could not stop this process","err":%q}`+"\n", err.Error())
			return
		}
		fmt.Fprintf(os.Stderr, `{"level":"WARN","msg":"fault plan: woken (SIGCONT): this process goes on from the point","pid":%d}`+"\n", os.Getpid())
	}
	if effects == nil {
		freeze()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if err := effects.Quiesce(ctx, freeze); err != nil {
		fmt.Fprintf(os.Stderr, `{"level":"ERROR","msg":"fault plan: the effect store stayed busy; stopping anyway","err":%q}`+"\n", err.Error())
		freeze()
	}
}
