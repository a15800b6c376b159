// Package faultmatrix proves the ledger's guarantees when things break. A
// scenario is tool guarantees × fault point × expectation; the runner starts
// the real `ledger` binary (it builds nothing itself) with a fault plan in
// its environment, lets the plan SIGKILL it at the fault point, starts it
// again, lets recovery act, and checks the outcome against the simulator's
// independent side-effect store: never two effects for one action unless
// the tool dedups them, no effect the tool made lost, every unknown effect
// in review with a rationale, and the event chain valid.
//
// RunWrites (writes.go) is the other half: it kills the binary at its i-th
// store write for every i one run reaches, before and after each commit,
// and checks all or nothing and the same invariants after each restart.
//
// It may import anything of the project; nothing imports it but the CLI.
package faultmatrix
