package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// RuleSet is an approval rule set as a gate ran with it, kept under its
// digest: the canonical JSON document the digest covers (package approval
// writes it: the rules and the defaults that apply where none matches) and
// when it was first stored. An action's gate names the digest of the rule
// set that decided it (ActionGate.RulesDigest), and the chain binds the
// action, so a stored rule set is checked by its digest alone: a document
// edited behind the ledger's back no longer has the digest it is kept
// under (FindChain, VerifyChain).
type RuleSet struct {
	Digest   Digest
	Document json.RawMessage
	StoredAt time.Time
}

// Check reports whether the document still has the digest the rule set is
// kept under: nil, or a CodeConflict error saying what it has instead.
func (r *RuleSet) Check() error {
	if msg := r.problem(); msg != "" {
		return Errorf(CodeConflict, "%s", msg)
	}
	return nil
}

// problem is Check's message; "" if the document has its digest.
func (r *RuleSet) problem() string {
	if got := DigestCanonical(r.Document); got != r.Digest {
		return fmt.Sprintf("rule set %s: the stored document has digest %s, not the digest it is kept under", r.Digest, got)
	}
	return ""
}

// PutRuleSetResult is what PutRuleSet stored or found.
type PutRuleSetResult struct {
	RuleSet *RuleSet
	// Created is false when the rule set was stored already.
	Created bool
}

// RuleSetFilter selects rule sets.
type RuleSetFilter struct {
	// Digests, if not nil, selects these rule sets, those stored, in the
	// order given (repeats once); otherwise every rule set, newest stored
	// first.
	Digests []Digest
	// Limit caps how many are returned; 0 is no limit.
	Limit int
}

// PutRuleSet implements Store: it stores document (canonicalized) under
// its digest unless a rule set has that digest already, outside any run's
// lease.
func (s *DB) PutRuleSet(ctx context.Context, document json.RawMessage) (PutRuleSetResult, error) {
	doc, err := Canonicalize(document)
	if err != nil {
		return PutRuleSetResult{}, wrapErr("put rule set", err)
	}
	var out PutRuleSetResult
	rs := &RuleSet{Digest: DigestCanonical(doc), Document: doc}
	err = s.inTx(WithoutRunLease(ctx), "put_rule_set", func(tx *txn) error {
		rs.StoredAt = tx.now
		created, err := tx.d.InsertRuleSet(tx.ctx, rs)
		if err != nil {
			return err
		}
		out = PutRuleSetResult{RuleSet: rs, Created: created}
		if created {
			return nil
		}
		stored, err := tx.d.GetRuleSet(tx.ctx, rs.Digest)
		if err != nil {
			return err
		}
		if err := stored.Check(); err != nil {
			return err
		}
		out.RuleSet = stored
		return nil
	})
	if err != nil {
		return PutRuleSetResult{}, err
	}
	return out, nil
}

// FindRuleSets implements Store.
func (s *DB) FindRuleSets(ctx context.Context, f RuleSetFilter) ([]*RuleSet, error) {
	if f.Limit < 0 {
		return nil, Errorf(CodeInvalid, "find rule sets: negative limit %d", f.Limit)
	}
	var out []*RuleSet
	err := s.readSnapshot(ctx, "find_rule_sets", func(r Reader) (err error) {
		out, err = readRuleSets(ctx, r, f)
		return err
	})
	return out, err
}

// readRuleSets reads the rule sets f selects on r.
func readRuleSets(ctx context.Context, r Reader, f RuleSetFilter) ([]*RuleSet, error) {
	if f.Digests == nil {
		return r.ListRuleSets(ctx, f.Limit)
	}
	out := []*RuleSet{}
	for i, d := range f.Digests {
		if slices.Contains(f.Digests[:i], d) {
			continue
		}
		if f.Limit > 0 && len(out) == f.Limit {
			break
		}
		rs, err := r.GetRuleSet(ctx, d)
		switch {
		case Code(err) == CodeNotFound:
			continue
		case err != nil:
			return nil, fmt.Errorf("read rule set %s: %w", d, err)
		}
		out = append(out, rs)
	}
	return out, nil
}

// citedRuleSets are the digests of the rule sets actions cite, in the
// order of their first citation.
func citedRuleSets(actions []*Action) []Digest {
	var out []Digest
	for _, a := range actions {
		if a.Gate != nil && a.Gate.RulesDigest != "" && !slices.Contains(out, a.Gate.RulesDigest) {
			out = append(out, a.Gate.RulesDigest)
		}
	}
	return out
}

// verifyRuleSets checks the stored rule sets a chain's actions cite: the
// first whose document lost its digest breaks the chain at the event that
// first bound an action citing it.
func verifyRuleSets(c *Chain) {
	if !c.Report.OK {
		return
	}
	for _, rs := range c.RuleSets {
		msg := rs.problem()
		if msg == "" {
			continue
		}
		c.Report.OK = false
		c.Report.Reason = msg
		c.Report.Entity, c.Report.EntityID = "rule_set", string(rs.Digest)
		for _, a := range c.Actions {
			if a.Gate != nil && a.Gate.RulesDigest == rs.Digest {
				c.Report.BrokenSeq = firstBinding(c.Events, ActionContentOf(a).Key())
				break
			}
		}
		return
	}
}

// firstBinding is the sequence number of the first event that bound the
// row key; 0 if none did.
func firstBinding(events []*Event, key RowKey) int64 {
	for _, e := range events {
		found := false
		_ = eachRow(e.Rows, func(k RowKey, _ Digest) {
			found = found || k == key
		})
		if found {
			return e.Seq
		}
	}
	return 0
}
