package engine_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/simulator"
)

// TestClientDrivenRunWaits: the engine takes no model step for a run of a
// client-driven agent (it has no model); the run goes to running and waits
// for the agent's process.
func TestClientDrivenRunWaits(t *testing.T) {
	send := contracts.ToolDescriptor{SchemaVersion: "1.0", Name: "payments.send", Version: "1", Effect: contracts.EffectWrite,
		ArgumentsSchema: json.RawMessage(`{"type":"object"}`), TimeoutMS: 1000}
	b := setupWith(t, simulator.Config{}, func(c *engine.Config) {
		c.Agents = append(c.Agents, engine.Agent{Name: "payer", Driver: engine.DriverClient,
			Tools: []engine.Tool{engine.ClientTool(send, engine.Lease{})}})
	})
	run := b.submit(t, "payer", "k1")
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunRunning, run.State)
	before := run.EventSeq
	run = b.advance(t, run.ID)
	require.Equal(t, ledger.RunRunning, run.State)
	require.Equal(t, before, run.EventSeq, "nothing recorded: no step was taken")
}
