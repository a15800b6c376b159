package provider

import (
	"context"
	"errors"
	"fmt"
)

// Chain asks its tiers in order until one answers. It falls to the next
// tier only on a Retryable failure (transport, timeout, 429, 5xx); a
// refusal is an answer and any other failure is returned as it is. Its
// last tier is deterministic, so a chain always answers unless a tier
// fails for a reason another would share, or the caller's context ends.
type Chain struct {
	tiers []Model
}

// Failure is one tier's failure before another answered.
type Failure struct {
	Tier         string    `json:"tier"`
	TierIndex    int       `json:"tier_index"`
	Kind         ErrorKind `json:"kind"`
	Status       int       `json:"status,omitempty"`
	RetryAfterMS int64     `json:"retry_after_ms,omitempty"`
	Message      string    `json:"message"` // the API key removed
}

// Answer is a chain's answer: the turn, which tier gave it, what failed
// before, and which opaque items the requests left out.
type Answer struct {
	Turn      Turn   `json:"turn"`
	Tier      string `json:"tier"`
	TierIndex int    `json:"tier_index"`
	Kind      Kind   `json:"kind"`
	// Degraded is true when the deterministic tier answered.
	Degraded bool      `json:"degraded"`
	Failures []Failure `json:"failures,omitempty"`
	// Drops lists, for each tier a request was sent to, the opaque items
	// of other formats (or unsendable ones of its own) left out of it.
	Drops []Drop `json:"drops,omitempty"`
}

// NewChain builds the tiers cfgs describe, in order. The last must be
// deterministic and no other may be; names must be unique. Every problem
// is reported, each with its tier.
func NewChain(cfgs []TierConfig, opts Options) (*Chain, error) {
	if len(cfgs) == 0 {
		return nil, errors.New("provider chain: no tiers")
	}
	var errs []error
	seen := map[string]bool{}
	models := make([]Model, 0, len(cfgs))
	for i, cfg := range cfgs {
		if cfg.Name != "" && seen[cfg.Name] {
			errs = append(errs, fmt.Errorf("tier %d: name %q used twice", i, cfg.Name))
		}
		seen[cfg.Name] = true
		m, err := New(cfg, opts)
		if err != nil {
			errs = append(errs, fmt.Errorf("tier %d: %w", i, err))
			continue
		}
		models = append(models, m)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("provider chain: %w", err)
	}
	return ChainOf(models...)
}

// ChainOf makes a chain of tiers already built. The last must be of kind
// deterministic and no other may be: a tier after a deterministic one
// could never answer.
func ChainOf(tiers ...Model) (*Chain, error) {
	if len(tiers) == 0 {
		return nil, errors.New("provider chain: no tiers")
	}
	for i, m := range tiers {
		last := i == len(tiers)-1
		switch {
		case last && m.Kind() != KindDeterministic:
			return nil, fmt.Errorf("provider chain: the last tier (%q) is %s: it must be deterministic, which never fails", m.Name(), m.Kind())
		case !last && m.Kind() == KindDeterministic:
			return nil, fmt.Errorf("provider chain: tier %d (%q) is deterministic but not last: the tiers after it could never answer", i, m.Name())
		}
	}
	return &Chain{tiers: tiers}, nil
}

// Complete asks each tier in turn. It returns the first answer, with the
// failures before it; or, with the Answer's failures and drops so far, the
// first failure that is not Retryable (a refused request, a 4xx other than
// 408 and 429, an answer that cannot be read) or the caller's context
// error.
func (c *Chain) Complete(ctx context.Context, req Request) (Answer, error) {
	var ans Answer
	if err := req.validate(); err != nil {
		return ans, &Error{Kind: ErrorClient, Message: err.Error(), Err: err}
	}
	for i, m := range c.tiers {
		if err := ctx.Err(); err != nil {
			return ans, fmt.Errorf("provider chain: %w", err)
		}
		if m.Kind() != KindDeterministic { // it sends no request
			for _, d := range drops(m.Kind(), req) {
				d.Tier, d.TierIndex = m.Name(), i
				ans.Drops = append(ans.Drops, d)
			}
		}
		turn, err := m.Complete(ctx, req)
		if err == nil {
			ans.Turn, ans.Tier, ans.TierIndex, ans.Kind = turn, m.Name(), i, m.Kind()
			ans.Degraded = m.Kind() == KindDeterministic
			return ans, nil
		}
		var pe *Error
		if !Retryable(err) || !errors.As(err, &pe) || ctx.Err() != nil {
			return ans, err
		}
		ans.Failures = append(ans.Failures, Failure{
			Tier: m.Name(), TierIndex: i, Kind: pe.Kind, Status: pe.Status,
			RetryAfterMS: pe.RetryAfter.Milliseconds(), Message: pe.Message,
		})
	}
	// Unreachable: ChainOf makes the last tier deterministic.
	return ans, errors.New("provider chain: no tier answered")
}
