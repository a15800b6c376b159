package ledger

import (
	"context"
	"encoding/json"
)

// RecoveryFilter selects what FindRecoveryFacts returns. The zero value
// selects every action recovery has to decide.
type RecoveryFilter struct {
	// ActionID, if set, selects that one action whatever its state and its
	// run's (a caller recovering one action it already chose); the other
	// fields are ignored then.
	ActionID *ActionID
	// AfterRun and Runs page through the scan by run, so that its memory
	// does not grow with the ledger: only runs whose id is greater than
	// AfterRun, and at most Runs of them (0: no limit). A page never splits
	// a run's actions.
	AfterRun *RunID
	Runs     int
}

// RecoveryFacts is what the ledger knows of one action recovery has to
// decide, read in one snapshot: the action, its run with the run's budget,
// its last attempt, how many queries about that attempt failed, and the
// run's cancellation.
type RecoveryFacts struct {
	Run    *Run
	Action *Action
	// Attempt is the action's last attempt (highest number); nil if it has
	// none.
	Attempt *Attempt
	// FailedQueries counts the failed queries recorded about Attempt:
	// observations from a query (source tool_query) with an unknown effect
	// whose detail is a JSON object with a non-empty string "error" — what
	// recovery records when a query fails, as opposed to a tool answering
	// "unknown".
	FailedQueries int
	// UnknownQueries counts every query about Attempt that did not
	// establish its effect (failed, or answered unknown); UnknownCancels
	// every cancel about it that was not confirmed. An agent that answers
	// for its tool (the agent protocol) is asked again only while these
	// say it has not answered yet.
	UnknownQueries, UnknownCancels int
	// Cancellation is the state of the run's cancellation; "" if none was
	// requested.
	Cancellation CancellationState
}

// FindRecoveryFacts implements Store.
func (s *DB) FindRecoveryFacts(ctx context.Context, f RecoveryFilter) ([]*RecoveryFacts, error) {
	if f.Runs < 0 {
		return nil, Errorf(CodeInvalid, "find recovery facts: runs cannot be negative")
	}
	var unknown []*Observation
	out, err := read(ctx, s, "find_recovery_facts", func(r Reader) ([]*RecoveryFacts, error) {
		facts, obs, err := r.ListRecoveryFacts(ctx, f)
		unknown = obs
		return facts, err
	})
	if err != nil {
		return nil, err
	}
	byAttempt := make(map[AttemptID]*RecoveryFacts, len(out))
	for _, rf := range out {
		if rf.Attempt != nil {
			byAttempt[rf.Attempt.ID] = rf
		}
	}
	for _, o := range unknown {
		rf := byAttempt[o.AttemptID]
		switch {
		case rf == nil:
		case o.Source == ObservedCancel:
			rf.UnknownCancels++
		default:
			rf.UnknownQueries++
			if isFailedQuery(string(o.Detail)) {
				rf.FailedQueries++
			}
		}
	}
	if f.ActionID != nil && len(out) == 0 {
		return nil, Errorf(CodeNotFound, "find recovery facts: action %s not found", *f.ActionID)
	}
	return out, nil
}

// isFailedQuery reports whether an observation's detail records a failed
// query: a JSON object whose "error" is a non-empty string (what recovery
// writes for a query that returned an error).
func isFailedQuery(detail string) bool {
	if detail == "" {
		return false
	}
	var d struct {
		Error string `json:"error"`
	}
	return json.Unmarshal([]byte(detail), &d) == nil && d.Error != ""
}
