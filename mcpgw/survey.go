package mcpgw

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool statuses against the lock file.
const (
	// StatusConfirmed: the upstream lists the confirmed definition.
	StatusConfirmed = "confirmed"
	// StatusUnconfirmed: no definition of the tool was ever confirmed.
	StatusUnconfirmed = "unconfirmed"
	// StatusChanged: the upstream lists another definition than the
	// confirmed one; the tool is hidden until confirmed again.
	StatusChanged = "changed"
	// StatusGone: confirmed, but the upstream no longer lists it.
	StatusGone = "gone"
)

// ToolStatus is one upstream tool against the lock file.
type ToolStatus struct {
	Name     string `json:"name"` // <upstream>__<tool>
	Upstream string `json:"upstream"`
	Tool     string `json:"tool"`
	Status   string `json:"status"`
	// Listed is the digest of the definition the upstream lists now, "" if
	// gone; Confirmed the confirmed one, "" if none.
	Listed    ledger.Digest `json:"listed_digest,omitempty"`
	Confirmed ledger.Digest `json:"confirmed_digest,omitempty"`
	// Effect and Guarantees are the profile's (a tool without one is a
	// write with no guarantees); Profile says whether the config has one.
	Effect     string `json:"effect"`
	Guarantees string `json:"guarantees"`
	Profile    string `json:"profile"`

	def *mcp.Tool
}

// Survey connects to every upstream and lists each of its tools, and each
// confirmed tool it no longer lists, with its status, sorted by name.
func (g *Gateway) Survey(ctx context.Context) ([]ToolStatus, error) {
	var out []ToolStatus
	seen := map[string]bool{}
	for _, u := range g.cfg.Upstreams {
		defs, err := g.ListUpstream(ctx, u.Name)
		if err != nil {
			return nil, err
		}
		for _, def := range defs {
			_, digest, err := definitionOf(def)
			if err != nil {
				return nil, err
			}
			name := clientName(u.Name, def.Name)
			seen[name] = true
			s := g.status(u.Name, def.Name)
			s.Listed, s.def = digest, def
			switch {
			case s.Confirmed == "":
				s.Status = StatusUnconfirmed
			case s.Confirmed == digest:
				s.Status = StatusConfirmed
			default:
				s.Status = StatusChanged
			}
			out = append(out, s)
		}
	}
	for name, lt := range g.lock.Tools {
		if _, ok := g.ups[lt.Upstream]; ok && !seen[name] {
			s := g.status(lt.Upstream, lt.Tool)
			s.Status = StatusGone
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b ToolStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// status is a tool's entry with its profile and confirmed digest.
func (g *Gateway) status(upstream, tool string) ToolStatus {
	u := g.ups[upstream]
	p, configured := u.cfg.Profile(tool)
	s := ToolStatus{Name: clientName(upstream, tool), Upstream: upstream, Tool: tool, Effect: string(p.Effect), Profile: "none: a write with no guarantees"}
	if configured {
		s.Profile = "configured"
	}
	var g3 []string
	for _, x := range []struct {
		on   bool
		name string
	}{{p.Guarantees.Query, "query"}, {p.Guarantees.Dedup, "dedup"}, {p.Guarantees.Cancel, "cancel"}} {
		if x.on {
			g3 = append(g3, x.name)
		}
	}
	s.Guarantees = strings.Join(g3, ",")
	if s.Guarantees == "" {
		s.Guarantees = "none"
	}
	if lt, ok := g.lock.Tools[s.Name]; ok {
		s.Confirmed = lt.Digest
	}
	return s
}

// Confirm records, in the lock file, the definitions the upstreams list now
// of the named tools, and answers the names confirmed.
func (g *Gateway) Confirm(ctx context.Context, names []string, by string, at time.Time) ([]string, error) {
	st, err := g.Survey(ctx)
	if err != nil {
		return nil, err
	}
	var done []string
	for _, s := range st {
		if s.def == nil || !slices.Contains(names, s.Name) {
			continue
		}
		lt, err := g.lock.Confirm(s.Upstream, s.def, by, at)
		if err != nil {
			return nil, err
		}
		if _, err := g.newTool(g.ups[s.Upstream], lt); err != nil {
			return nil, fmt.Errorf("tool %s cannot be served: %w", s.Name, err)
		}
		done = append(done, s.Name)
	}
	if len(done) == 0 {
		return nil, nil
	}
	return done, WriteLock(g.lockPath, g.lock)
}
