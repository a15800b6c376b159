package engine

// FaultPoint names a dangerous moment of an attempt, where a fault plan
// may kill the process to prove recovery (docs/evidence.md, "The fault matrix").
type FaultPoint string

// The fault points of an attempt, in order.
const (
	FaultBeforeAttemptRecorded FaultPoint = "before_attempt_recorded"
	FaultAfterAttemptRecorded  FaultPoint = "after_attempt_recorded" // recorded, tool not called yet
	FaultBeforeToolCall        FaultPoint = "before_tool_call"       // deadline set, lease checked to outlast it, tool not called yet
	FaultAfterToolCall         FaultPoint = "after_tool_call"        // the tool acted, its result not recorded
	FaultAfterResultRecorded   FaultPoint = "after_result_recorded"  // recorded, next step not taken
	// FaultAwaitingApproval: the run has just started waiting for a person.
	FaultAwaitingApproval FaultPoint = "awaiting_approval"
	// FaultCancelStopping: a cancel is accepted and stopping, nothing
	// confirmed yet.
	FaultCancelStopping FaultPoint = "cancel_stopping"
)

// Fault points: where the fault matrix and the crash tests strike the engine
// (Config.FaultFunc), never reachable from the network.

// FaultPoints lists the four crash points of an attempt, in order.
// FaultBeforeToolCall is not one of them: a crash there leaves what a crash
// at FaultAfterAttemptRecorded leaves (the attempt recorded, the tool not
// called); it is where a process is paused (the fault matrix's
// replica/stop cells), between its lease check and its call.
func FaultPoints() []FaultPoint {
	return []FaultPoint{FaultBeforeAttemptRecorded, FaultAfterAttemptRecorded, FaultAfterToolCall, FaultAfterResultRecorded}
}

// AllFaultPoints lists every fault point, the attempt's and the others.
func AllFaultPoints() []FaultPoint {
	return append(FaultPoints(), FaultBeforeToolCall, FaultAwaitingApproval, FaultCancelStopping)
}

func (e *Engine) fault(p FaultPoint) {
	if e.cfg.FaultFunc != nil {
		e.cfg.FaultFunc(p)
	}
}
