package recovery_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
	"github.com/stretchr/testify/require"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// combos is all 8 combinations of query/dedup/cancel.
func combos() []contracts.Guarantees {
	var out []contracts.Guarantees
	for i := range 8 {
		out = append(out, contracts.Guarantees{Query: i&4 != 0, Dedup: i&2 != 0, Cancel: i&1 != 0})
	}
	return out
}

func name(g contracts.Guarantees) string {
	return fmt.Sprintf("query=%t,dedup=%t,cancel=%t", g.Query, g.Dedup, g.Cancel)
}

func inFlight(g contracts.Guarantees) recovery.Facts {
	return recovery.Facts{
		Action:  &ledger.Action{ID: "act_1", State: ledger.ActionRunning},
		Attempt: &ledger.Attempt{ID: "att_1", Status: ledger.AttemptStarted, Effect: ledger.EffectUnknown, StartedAt: t0},
		Tool:    recovery.Tool{Guarantees: g},
		Now:     t0.Add(time.Minute),
	}
}

// row is one line of the table: a situation, and the decision expected for
// each guarantee combination.
type row struct {
	name  string
	facts func(g contracts.Guarantees) recovery.Facts
	want  func(g contracts.Guarantees) recovery.Kind
}

func TestDecideTable(t *testing.T) {
	any := func(k recovery.Kind) func(contracts.Guarantees) recovery.Kind {
		return func(contracts.Guarantees) recovery.Kind { return k }
	}
	rows := []row{
		{"approved, no attempt yet", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Action.State, f.Attempt = ledger.ActionApproved, nil
			return f
		}, any(recovery.Continue)},
		{"awaiting approval", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Action.State, f.Attempt = ledger.ActionAwaitingApproval, nil
			return f
		}, any(recovery.Wait)},
		{"attempt started, no outcome: first step", inFlight, func(g contracts.Guarantees) recovery.Kind {
			switch {
			case g.Query:
				return recovery.Query
			case g.Dedup:
				return recovery.Continue
			case g.Cancel:
				return recovery.Cancel
			default:
				return recovery.Review
			}
		}},
		{"timed out (finished, effect unknown): same as no outcome", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Action.State, f.Attempt.Status = ledger.ActionUncertain, ledger.AttemptTimedOut
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			switch {
			case g.Query:
				return recovery.Query
			case g.Dedup:
				return recovery.Continue
			case g.Cancel:
				return recovery.Cancel
			default:
				return recovery.Review
			}
		}},
		{"query says happened", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Query = &recovery.QueryAnswer{Effect: ledger.EffectHappened}
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Reconcile
			}
			return firstStepWithoutQuery(g) // an answer from a tool that cannot be queried is ignored
		}},
		{"query says not happened", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Query = &recovery.QueryAnswer{Effect: ledger.EffectNotHappened}
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Continue
			}
			return firstStepWithoutQuery(g)
		}},
		{"query says unknown", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Query = &recovery.QueryAnswer{Effect: ledger.EffectUnknown}
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Review
			}
			return firstStepWithoutQuery(g)
		}},
		{"query errors, budget left: ask again later", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Query, f.QueryFailures = &recovery.QueryAnswer{Err: errors.New("503")}, 1
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Wait
			}
			return firstStepWithoutQuery(g)
		}},
		{"query errors, recovery budget spent", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Query, f.QueryFailures = &recovery.QueryAnswer{Err: errors.New("503")}, 3
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Review
			}
			return firstStepWithoutQuery(g)
		}},
		{"query too early to trust (visibility delay)", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Tool.QueryVisibility = 2 * time.Minute
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Wait
			}
			return firstStepWithoutQuery(g)
		}},
		{"dedup window passed", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Tool.DedupRetention = 30 * time.Second
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			switch {
			case g.Query:
				return recovery.Query
			case g.Dedup:
				return recovery.Review
			case g.Cancel:
				return recovery.Cancel
			default:
				return recovery.Review
			}
		}},
		{"cancel confirmed", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Cancel = &recovery.CancelAnswer{Confirmed: true}
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			// A confirmed cancel establishes "not happened" whatever else the tool can do.
			return recovery.Continue
		}},
		{"cancel not confirmed", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Cancel = &recovery.CancelAnswer{Confirmed: false}
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			switch {
			case g.Query:
				return recovery.Query
			case g.Dedup:
				return recovery.Continue
			default:
				return recovery.Review
			}
		}},
		{"retry budget exhausted, effect established not happened", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Attempt.Effect = ledger.EffectNotHappened
			f.Retry, f.RetryRationale = ledger.StopRetryBudgetExhausted, "action used 3 of 3 attempts"
			return f
		}, any(recovery.Stop)},
		{"retry budget exhausted, effect unknown", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Retry, f.RetryRationale = ledger.StopRetryBudgetExhausted, "action used 3 of 3 attempts"
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			switch {
			case g.Query:
				return recovery.Query // establish the effect first; stop only what did not happen
			case g.Dedup:
				return recovery.Review
			case g.Cancel:
				return recovery.Cancel
			default:
				return recovery.Review
			}
		}},
		{"time budget exhausted, query finds nothing", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Query = &recovery.QueryAnswer{Effect: ledger.EffectNotHappened}
			f.Retry, f.RetryRationale = ledger.StopMaxRuntime, "run used 1m of 1m execution time"
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Stop
			}
			if g.Dedup || !g.Cancel {
				return recovery.Review
			}
			return recovery.Cancel
		}},
		{"cancel accepted, attempt in flight", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Cancelling = true
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			switch {
			case g.Cancel:
				return recovery.Cancel
			case g.Query:
				return recovery.Query
			default:
				return recovery.Review // no resend while cancelling, even for a dedup tool
			}
		}},
		{"cancel accepted, tool confirmed the cancel", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Cancelling, f.Cancel = true, &recovery.CancelAnswer{Confirmed: true}
			return f
		}, any(recovery.Cancelled)},
		{"cancel accepted, cancel unconfirmed", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Cancelling, f.Cancel = true, &recovery.CancelAnswer{Err: errors.New("gone")}
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Query
			}
			return recovery.Review
		}},
		{"cancel accepted, query found the effect", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Cancelling, f.Cancel = true, &recovery.CancelAnswer{Confirmed: false}
			f.Query = &recovery.QueryAnswer{Effect: ledger.EffectHappened}
			return f
		}, func(g contracts.Guarantees) recovery.Kind {
			if g.Query {
				return recovery.Reconcile
			}
			return recovery.Review
		}},
		{"cancel accepted before the action started", func(g contracts.Guarantees) recovery.Facts {
			f := inFlight(g)
			f.Action.State, f.Attempt, f.Cancelling = ledger.ActionApproved, nil, true
			return f
		}, any(recovery.Cancelled)},
	}
	for _, r := range rows {
		for _, g := range combos() {
			t.Run(r.name+"/"+name(g), func(t *testing.T) {
				d := recovery.Decide(r.facts(g))
				require.Equal(t, r.want(g), d.Kind, d.Rationale)
				require.NotEmpty(t, d.Rationale, "every decision says why")
				if d.Kind == recovery.Stop {
					require.True(t, d.StopReason.Valid())
				}
			})
		}
	}
}

// firstStepWithoutQuery is the first decision for a tool that cannot be
// queried.
func firstStepWithoutQuery(g contracts.Guarantees) recovery.Kind {
	switch {
	case g.Dedup:
		return recovery.Continue
	case g.Cancel:
		return recovery.Cancel
	default:
		return recovery.Review
	}
}

// TestDecideNeverRetriesUnknownUnsafely walks every combination of facts
// and checks the principles that must hold whatever the table says.
func TestDecideNeverRetriesUnknownUnsafely(t *testing.T) {
	queries := []*recovery.QueryAnswer{nil, {Effect: ledger.EffectHappened}, {Effect: ledger.EffectNotHappened},
		{Effect: ledger.EffectUnknown}, {Err: errors.New("x")}}
	cancels := []*recovery.CancelAnswer{nil, {Confirmed: true}, {Confirmed: false}, {Err: errors.New("x")}}
	n := 0
	for _, g := range combos() {
		for _, q := range queries {
			for _, c := range cancels {
				for _, cancelling := range []bool{false, true} {
					for _, retry := range []ledger.StopReason{"", ledger.StopRetryBudgetExhausted} {
						for _, failures := range []int{0, 1, 3} {
							f := inFlight(g)
							f.Query, f.Cancel, f.Cancelling, f.Retry, f.QueryFailures = q, c, cancelling, retry, failures
							d := recovery.Decide(f)
							n++
							established := (g.Query && q != nil && q.Err == nil && q.Effect != ledger.EffectUnknown) ||
								(c != nil && c.Err == nil && c.Confirmed)
							if d.Kind == recovery.Continue && !established {
								require.True(t, g.Dedup && !cancelling && retry == "",
									"%s: retried an unknown effect without dedup: %+v", name(g), d)
							}
							if d.Kind == recovery.Continue || d.Kind == recovery.Stop || d.Kind == recovery.Cancelled {
								require.NotEqual(t, ledger.EffectHappened, d.Effect)
							}
							if d.Kind == recovery.Stop {
								require.True(t, established, "stop only what is known not to have happened: %+v", d)
							}
							if q != nil && q.Err != nil && d.Kind == recovery.Continue {
								require.False(t, strings.Contains(d.Rationale, "query found"), "a failed query is no answer")
							}
						}
					}
				}
			}
		}
	}
	require.Equal(t, 8*5*4*2*2*3, n)
}
