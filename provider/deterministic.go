package provider

import (
	"bytes"
	"context"
	"encoding/json"
)

// deterministic is the last tier of every chain: it answers with the
// answer its config declares, never fails, makes no network call and
// reports exact zero usage (a non-nil Usage: nothing was used, which is
// known). An answer from it is degraded.
type deterministic struct {
	name string
	text string
}

func newDeterministic(cfg TierConfig) *deterministic {
	text := cfg.Text
	if len(cfg.Answer) > 0 {
		var b bytes.Buffer
		_ = json.Compact(&b, cfg.Answer) // valid: checked by TierConfig.validate
		text = b.String()
	}
	return &deterministic{name: cfg.Name, text: text}
}

// Complete implements Model. It reads nothing of the request.
func (d *deterministic) Complete(context.Context, Request) (Turn, error) {
	return Turn{Text: d.text, Stop: StopEndTurn, Usage: &Usage{}, Model: string(KindDeterministic)}, nil
}

// Kind implements Model.
func (d *deterministic) Kind() Kind { return KindDeterministic }

// Name implements Model.
func (d *deterministic) Name() string { return d.name }
