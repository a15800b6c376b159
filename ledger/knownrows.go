package ledger

// knownRows are rows a write keeps in memory instead of writing each change
// as it makes it: a recovery pass (RecordRecovery) moves one action up to
// three times, sets its attempt's effect and closes it, and spends the
// run's budget, and each of those would otherwise be a guarded UPDATE of
// its own, most of them handing the whole row back for the event that
// binds it. With the rows known, each change is made on the copy here
// (as the driver's statement would make it), bound into its event from
// that copy, and every changed row is written once, when the write is done
// (flushRows), guarded on the version it had when the write first knew it
// (the budget, which carries no version in the domain, on its usage).
//
// The rows are known either from a read of the write itself or from the
// facts a recovery pass decided on (RecordRecoveryParams.Facts), read
// before the write: then the guards are what makes the write refuse
// (CodeConflict, nothing written) if another write changed one of them
// since, so that nothing is decided from facts that were no longer true.
//
// Only the write that sets txn.known uses them, and it reads none of these
// rows back before flushRows: a read of the database would not see the
// changes yet.
type knownRows struct {
	action      *Action
	actionFrom  int64
	attempt     *Attempt
	attemptFrom int64
	// budget is the budget of budgetRun; nil if the write does not know it
	// (spendExecution then has the driver add to it and hand it back).
	budget     *Budget
	budgetRun  RunID
	budgetFrom BudgetUsage

	actionDirty, attemptDirty, budgetDirty bool
}

// knowAction, knowAttempt and knowBudget make the rows known as they stand
// now; the copies are the write's own.
func (k *knownRows) knowAction(a *Action) {
	c := *a
	k.action, k.actionFrom = &c, a.Version
}

func (k *knownRows) knowAttempt(a *Attempt) *Attempt {
	c := *a
	k.attempt, k.attemptFrom = &c, a.Version
	return k.attempt
}

func (k *knownRows) knowBudget(run RunID, b Budget) {
	k.budget, k.budgetRun, k.budgetFrom = &b, run, b.Used
}

// holdsAttempt reports whether att is the known attempt itself.
func (k *knownRows) holdsAttempt(att *Attempt) bool {
	return k != nil && k.attempt != nil && k.attempt == att
}

// changedAttempt marks the known attempt changed, if att is it.
func (k *knownRows) changedAttempt(att *Attempt) {
	if k.holdsAttempt(att) {
		k.attemptDirty = true
	}
}

// actionOf is the known action if its id is id, else nil.
func (k *knownRows) actionOf(id ActionID) *Action {
	if k == nil || k.action == nil || k.action.ID != id {
		return nil
	}
	return k.action
}

// budgetOf is the known budget if it is run's, else nil.
func (k *knownRows) budgetOf(run RunID) *Budget {
	if k == nil || k.budget == nil || k.budgetRun != run {
		return nil
	}
	return k.budget
}

// flushRows writes the known rows the write changed, each guarded on what
// it was when the write first knew it.
func (tx *txn) flushRows() error {
	k := tx.known
	if k == nil {
		return nil
	}
	// guarded runs a guarded write of a copy of a row as it stands now.
	guarded := func(what, id string, set func(d Tx) (bool, error)) error {
		return tx.write(func(d Tx) error {
			ok, err := set(d)
			if err != nil {
				return err
			}
			if !ok {
				return Errorf(CodeConflict, "%s %s changed since it was read: decided on stale facts", what, id)
			}
			return nil
		})
	}
	if k.attemptDirty {
		att, from := *k.attempt, k.attemptFrom
		if err := guarded("attempt", string(att.ID), func(d Tx) (bool, error) { return d.SetAttempt(tx.ctx, &att, from) }); err != nil {
			return err
		}
		k.attemptFrom, k.attemptDirty = att.Version, false
	}
	if k.budgetDirty {
		run, from, to := k.budgetRun, k.budgetFrom, k.budget.Used
		if err := guarded("budget of run", string(run), func(d Tx) (bool, error) { return d.SetBudgetUsed(tx.ctx, run, from, to) }); err != nil {
			return err
		}
		k.budgetFrom, k.budgetDirty = to, false
	}
	if k.actionDirty {
		a, from := *k.action, k.actionFrom
		if err := guarded("action", string(a.ID), func(d Tx) (bool, error) { return d.SetAction(tx.ctx, &a, from) }); err != nil {
			return err
		}
		k.actionFrom, k.actionDirty = a.Version, false
	}
	return nil
}
