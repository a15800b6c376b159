package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/recovery"
)

// The registry: the agents and tools the engine was built with, and what
// recovery and the front ends look up in it.

type registeredAgent struct {
	Agent
	tools map[string]registeredTool
}

type registeredTool struct {
	Tool
	desc contracts.ToolDescriptor
	args *contracts.ArgumentValidator
}

// registerTools registers Config.Tools: each once, never a client tool,
// its arguments schema compiled, and agreeing with an agent's tool of the
// same name.
func (e *Engine) registerTools(tools []Tool) error {
	e.tools = map[string]registeredTool{}
	for _, t := range tools {
		d := t.Descriptor()
		if _, client := LeaseOf(t); client {
			return fmt.Errorf("engine: tool %s: a client tool is its agent's, not one the engine calls", d.Name)
		}
		if _, dup := e.tools[d.Name]; dup {
			return fmt.Errorf("engine: tool %q registered twice", d.Name)
		}
		v, err := d.ArgumentValidator()
		if err != nil {
			return fmt.Errorf("engine: tool %s: %w", d.Name, err)
		}
		for _, a := range e.agents {
			if other, ok := a.tools[d.Name]; ok && !reflect.DeepEqual(other.desc, d) {
				return fmt.Errorf("engine: tool %s: agent %s has a tool of that name with another descriptor", d.Name, a.Name)
			}
		}
		e.tools[d.Name] = registeredTool{Tool: t, desc: d, args: v}
	}
	return nil
}

// Tools lists the descriptors of Config.Tools, in name order.
func (e *Engine) Tools() []contracts.ToolDescriptor {
	out := make([]contracts.ToolDescriptor, 0, len(e.tools))
	for _, name := range slices.Sorted(maps.Keys(e.tools)) {
		out = append(out, e.tools[name].desc)
	}
	return out
}

// registered is the tool of that name and version some agent, or
// Config.Tools, registered.
func (e *Engine) registered(name, version string) (registeredTool, bool) {
	for _, a := range e.agents {
		if t, ok := a.tools[name]; ok && t.desc.Version == version {
			return t, true
		}
	}
	t, ok := e.tools[name]
	return t, ok && t.desc.Version == version
}

// probe gives recovery what a registered tool guarantees and can answer.
func (e *Engine) probe(name, version string) (recovery.Probe, bool) {
	t, ok := e.registered(name, version)
	if !ok {
		return recovery.Probe{}, false
	}
	p := recovery.Probe{Tool: recovery.ToolFor(t.desc)}
	if lease, client := LeaseOf(t.Tool); client {
		// The agent asks its tool for recovery (the agent protocol).
		p.Client = true
		p.Tool.DecisionTimeout = lease.DecisionTimeout
		return p, true
	}
	if broken("retry_unknown") {
		p.Tool.Guarantees.Dedup = true
	}
	// What a tool answers a probe is recorded as evidence: redacted
	// first, its errors too (their text reaches rationales).
	if q, ok := t.Tool.(Querier); ok && t.desc.Guarantees.Query {
		p.QueryFunc = func(ctx context.Context, key string) (ledger.EffectFact, json.RawMessage, error) {
			r, err := q.Query(ctx, key)
			return r.Effect, e.redactJSON(r.Output), e.redactErr(err)
		}
	}
	if c, ok := t.Tool.(Canceller); ok && t.desc.Guarantees.Cancel {
		p.CancelFunc = func(ctx context.Context, key string) (bool, json.RawMessage, error) {
			r, err := c.Cancel(ctx, key)
			return r.Confirmed, e.redactJSON(r.Detail), e.redactErr(err)
		}
	}
	return p, true
}

// HasAgent reports whether runs may name agent.
func (e *Engine) HasAgent(name string) bool { _, ok := e.agents[name]; return ok }

// AgentInfo is what the engine knows of a registered agent, for listing.
type AgentInfo struct {
	Name    string
	Driver  Driver
	Tenants []string // empty: every tenant
	// Tools are the agent's tools' descriptors, in registration order.
	Tools []contracts.ToolDescriptor
	// Policy is the loop-policy thresholds its runs are held to.
	Policy budget.Policy
}

// Agents lists the registered agents in name order.
func (e *Engine) Agents() []AgentInfo {
	out := make([]AgentInfo, 0, len(e.agents))
	for _, a := range e.agents {
		out = append(out, e.infoOf(a))
	}
	slices.SortFunc(out, func(x, y AgentInfo) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// AgentFor reports whether runs of tenant may name agent: it is registered
// and allows the tenant.
func (e *Engine) AgentFor(name, tenant string) (AgentInfo, bool) {
	a, ok := e.agents[name]
	if !ok || len(a.Tenants) > 0 && !slices.Contains(a.Tenants, tenant) {
		return AgentInfo{}, false
	}
	return e.infoOf(a), true
}

// infoOf is what Agents and AgentFor show of a registered agent.
func (e *Engine) infoOf(a *registeredAgent) AgentInfo {
	info := AgentInfo{Name: a.Name, Driver: a.Driver, Tenants: slices.Clone(a.Tenants), Policy: e.policyOf(a)}
	for _, t := range a.Agent.Tools {
		info.Tools = append(info.Tools, t.Descriptor())
	}
	return info
}

// policyOf is the loop policy of an agent's runs: its own thresholds, the
// engine's where it sets none, budget's defaults where neither does.
func (e *Engine) policyOf(a *registeredAgent) budget.Policy {
	p := a.Policy
	if p.RepeatLimit <= 0 {
		p.RepeatLimit = e.policy.RepeatLimit
	}
	if p.NoProgressWindow <= 0 {
		p.NoProgressWindow = e.policy.NoProgressWindow
	}
	if p.ConsecutiveErrors <= 0 {
		p.ConsecutiveErrors = e.policy.ConsecutiveErrors
	}
	return p.WithDefaults()
}

// Tool returns the descriptor of a tool any agent, or Config.Tools,
// registered.
func (e *Engine) Tool(name string) (contracts.ToolDescriptor, bool) {
	for _, a := range e.agents {
		if t, ok := a.tools[name]; ok {
			return t.desc, true
		}
	}
	if t, ok := e.tools[name]; ok {
		return t.desc, true
	}
	return contracts.ToolDescriptor{}, false
}
