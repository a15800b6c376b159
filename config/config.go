package config

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/actionledger/ledger/budget"
	"github.com/actionledger/ledger/contracts"
)

// DefaultHeartbeatTimeout is a client tool's lease after each heartbeat
// when its declaration sets none.
const DefaultHeartbeatTimeout = contracts.DefaultHeartbeatTimeoutMS * time.Millisecond

// MaxFileBytes is the largest config file Load and Parse take: 1 MiB, room
// for thousands of tools, and little enough that checking one ends in
// seconds. A larger file is refused before it is parsed.
const MaxFileBytes = 1 << 20

// ErrTooLarge is a config file over MaxFileBytes.
var ErrTooLarge = fmt.Errorf("over the cap of 1 MiB (%d bytes) on a config file", MaxFileBytes)

// DefaultDecisionTimeout is how long a client tool's agent may leave a
// recovery decision unanswered when its declaration sets none.
const DefaultDecisionTimeout = 5 * time.Minute

// Builtins are what this build has that a config file may name without
// declaring it.
type Builtins struct {
	// Tools are the tools an executor builtin may name, with their
	// descriptors.
	Tools []contracts.ToolDescriptor
	// Agents are the agents a driver builtin may name.
	Agents []string
}

// Config is a loaded config file, checked and with its defaults applied.
type Config struct {
	// Path is the file it was read from ("" if parsed from bytes).
	Path string
	// Tools are the declared tools, in file order.
	Tools []Tool
	// Agents are the declared agents, in file order.
	Agents []Agent
	// Rules are the approval rules, or nil when the file has none.
	Rules *contracts.Rules
	// MCP is the MCP gateway's section, or nil when the file has none;
	// lock_file is relative to the directory of Path.
	MCP *contracts.ConfigMCP
}

// Tool is one declared tool.
type Tool struct {
	// Descriptor is what the file declares, or for a builtin tool the
	// build's own descriptor.
	Descriptor contracts.ToolDescriptor
	// Executor is contracts.ExecutorClient, contracts.ExecutorBuiltin or
	// contracts.ExecutorHTTP.
	Executor contracts.Executor
	// HTTP is where and how the ledger reaches an http tool, its
	// MaxResponseBytes defaulted (contracts.DefaultHTTPMaxResponseBytes);
	// zero for any other tool.
	HTTP contracts.HTTPEndpoints
	// HeartbeatTimeout and MaxDuration are a client tool's lease: it lapses
	// HeartbeatTimeout after the last heartbeat (default
	// DefaultHeartbeatTimeout), and heartbeats renew it up to MaxDuration
	// after the attempt began (default the descriptor's timeout, and at
	// least HeartbeatTimeout). Both are 0 but for a client tool.
	HeartbeatTimeout time.Duration
	MaxDuration      time.Duration
	// DecisionTimeout is how long a client tool's agent may leave a
	// recovery decision unanswered before the action goes to a person
	// (default DefaultDecisionTimeout); 0 but for a client tool.
	DecisionTimeout time.Duration
}

// Agent is one declared agent.
type Agent struct {
	Name string
	// Driver is contracts.DriverClient or contracts.DriverBuiltin.
	Driver contracts.Driver
	// Tools are the names of a client agent's tools, each a client Tool of
	// the Config; nil for a builtin agent, which has its own.
	Tools []string
	// Tenants, if not empty, are the only tenants whose runs may name the
	// agent; empty means every tenant.
	Tenants []string
	// Policy holds the thresholds the file sets; a zero field takes the
	// server's default.
	Policy budget.Policy
}

// Tool returns the declared tool named name.
func (c *Config) Tool(name string) (Tool, bool) {
	i := slices.IndexFunc(c.Tools, func(t Tool) bool { return t.Descriptor.Name == name })
	if i < 0 {
		return Tool{}, false
	}
	return c.Tools[i], true
}

// Agent returns the declared agent named name.
func (c *Config) Agent(name string) (Agent, bool) {
	i := slices.IndexFunc(c.Agents, func(a Agent) bool { return a.Name == name })
	if i < 0 {
		return Agent{}, false
	}
	return c.Agents[i], true
}

// Error is a config file that cannot be used, with every problem found in
// it. It matches contracts.ErrInvalid (a breach of the file's contract),
// contracts.ErrUnsupportedVersion (a file of another major version) or
// ErrTooLarge, or wraps the error reading the file.
type Error struct {
	// Path is the file.
	Path string
	// Issues are the problems, sorted by location; empty when Err says it
	// all (the file could not be read, or is of another version).
	Issues []contracts.Issue
	// Err is the cause.
	Err error
}

// Error names the file, then gives one problem a line, "location: message"
// (the location "(document)" for the file as a whole).
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "config file %s", e.Path)
	switch len(e.Issues) {
	case 0:
		fmt.Fprintf(&b, ": %v", e.Err)
		return b.String()
	case 1:
		b.WriteString(": 1 problem:")
	default:
		fmt.Fprintf(&b, ": %d problems:", len(e.Issues))
	}
	for _, is := range e.Issues {
		loc := is.Location
		if loc == "" {
			loc = "(document)"
		}
		fmt.Fprintf(&b, "\n  %s: %s", loc, is.Message)
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// Format is how a config file is written.
type Format string

// Formats.
const (
	FormatJSON Format = "json"
	FormatYAML Format = "yaml"
)

// FormatOf is the format a file's name says: .json is JSON, anything else
// YAML (which JSON also is).
func FormatOf(path string) Format {
	if strings.EqualFold(filepath.Ext(path), ".json") {
		return FormatJSON
	}
	return FormatYAML
}

// Load reads the config file at path (its format by FormatOf) and checks
// it against b. A file over MaxFileBytes is refused before it is read
// whole. Any failure is an *Error.
func Load(path string, b Builtins) (*Config, error) {
	data, err := readCapped(path)
	if err != nil {
		return nil, &Error{Path: path, Err: err}
	}
	c, err := Parse(data, FormatOf(path), b)
	if err != nil {
		var ce *Error
		if errors.As(err, &ce) {
			ce.Path = path
		}
		return nil, err
	}
	c.Path = path
	return c, nil
}

// readCapped reads the file at path, refusing it (ErrTooLarge) as soon as
// its size, or what it gives when it has none (a pipe), passes
// MaxFileBytes.
func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Mode().IsRegular() && st.Size() > MaxFileBytes {
		return nil, fmt.Errorf("%d bytes, %w", st.Size(), ErrTooLarge)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("more than %d bytes, %w", MaxFileBytes, ErrTooLarge)
	}
	return data, nil
}

// Parse checks a config file's content, written in format, against b. A
// failure is an *Error without a Path.
func Parse(data []byte, format Format, b Builtins) (*Config, error) {
	if len(data) > MaxFileBytes {
		return nil, &Error{Err: fmt.Errorf("%d bytes, %w", len(data), ErrTooLarge)}
	}
	var opts contracts.ConfigOptions
	builtinTools := map[string]contracts.ToolDescriptor{}
	for _, d := range b.Tools {
		builtinTools[d.Name] = d
		opts.BuiltinTools = append(opts.BuiltinTools, d.Name)
	}
	opts.BuiltinAgents = slices.Clone(b.Agents)
	var (
		doc *contracts.Config
		err error
	)
	switch format {
	case FormatJSON:
		doc, err = contracts.ParseConfig(data, opts)
	case FormatYAML:
		doc, err = contracts.ParseConfigYAML(data, opts)
	default:
		return nil, &Error{Err: fmt.Errorf("config: unknown format %q", format)}
	}
	if err != nil {
		ce := &Error{Err: err}
		if ve := (*contracts.ValidationError)(nil); errors.As(err, &ve) {
			ce.Issues = ve.Issues
		}
		return nil, ce
	}
	c := &Config{Rules: doc.Rules, MCP: doc.MCP}
	for _, t := range doc.Tools {
		tool := Tool{Descriptor: t.ToolDescriptor, Executor: t.Executor}
		switch t.Executor {
		case contracts.ExecutorBuiltin:
			tool.Descriptor = builtinTools[t.Name]
		case contracts.ExecutorHTTP:
			tool.HTTP = t.HTTPEndpoints
			tool.HTTP.MaxResponseBytes = t.ResponseCap()
		default:
			tool.HeartbeatTimeout = t.HeartbeatTimeout()
			if tool.HeartbeatTimeout <= 0 {
				tool.HeartbeatTimeout = DefaultHeartbeatTimeout
			}
			tool.MaxDuration = t.MaxDuration()
			if tool.MaxDuration <= 0 {
				tool.MaxDuration = max(t.Timeout(), tool.HeartbeatTimeout)
			}
			tool.DecisionTimeout = t.DecisionTimeout()
			if tool.DecisionTimeout <= 0 {
				tool.DecisionTimeout = DefaultDecisionTimeout
			}
		}
		c.Tools = append(c.Tools, tool)
	}
	for _, a := range doc.Agents {
		agent := Agent{Name: a.Name, Driver: a.Driver, Tools: slices.Clone(a.Tools), Tenants: slices.Clone(a.Tenants)}
		if p := a.Policies; p != nil {
			agent.Policy = budget.Policy{RepeatLimit: p.RepeatLimit, NoProgressWindow: p.NoProgressWindow, ConsecutiveErrors: p.ConsecutiveErrors}
		}
		c.Agents = append(c.Agents, agent)
	}
	return c, nil
}
