package mcpgw

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/actionledger/ledger/ledger"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// LockVersion is the schema_version of the lock files this build writes
// and reads.
const LockVersion = "1.0"

// Lock is the file of confirmed tool definitions (mcp.lock_file): for
// each tool a client may see, the upstream's definition an operator
// confirmed its profile for. The gateway shows a tool only while the
// upstream's definition is the confirmed one.
type Lock struct {
	SchemaVersion string `json:"schema_version"`
	// Tools by the name clients see, <upstream>__<tool>.
	Tools map[string]LockedTool `json:"tools"`
}

// LockedTool is one confirmed definition.
type LockedTool struct {
	Upstream string `json:"upstream"`
	Tool     string `json:"tool"`
	// Digest is DefinitionDigest of Definition.
	Digest      ledger.Digest   `json:"digest"`
	Definition  json.RawMessage `json:"definition"`
	ConfirmedBy string          `json:"confirmed_by"`
	ConfirmedAt time.Time       `json:"confirmed_at"`
}

// ReadLock reads the lock file at path; a missing file is an empty lock.
func ReadLock(path string) (*Lock, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &Lock{SchemaVersion: LockVersion, Tools: map[string]LockedTool{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mcp lock file: %w", err)
	}
	var l Lock
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("mcp lock file %s: %w", path, err)
	}
	if l.SchemaVersion != LockVersion {
		return nil, fmt.Errorf("mcp lock file %s: schema_version %q is not %s", path, l.SchemaVersion, LockVersion)
	}
	if l.Tools == nil {
		l.Tools = map[string]LockedTool{}
	}
	for name, t := range l.Tools {
		got, err := ledger.DigestJSON(t.Definition)
		if err != nil || got != t.Digest || name != clientName(t.Upstream, t.Tool) {
			return nil, fmt.Errorf("mcp lock file %s: the entry %s does not match its definition: confirm the tool again", path, name)
		}
	}
	return &l, nil
}

// WriteLock writes l to path atomically (a temporary file renamed over
// it), readable by all, writable by its owner.
func WriteLock(path string, l *Lock) error {
	data, err := json.MarshalIndent(l, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".mcp-lock-*")
	if err != nil {
		return fmt.Errorf("mcp lock file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		return errors.Join(fmt.Errorf("mcp lock file: %w", err), tmp.Close())
	}
	if err := tmp.Chmod(0o644); err != nil {
		return errors.Join(fmt.Errorf("mcp lock file: %w", err), tmp.Close())
	}
	if err := tmp.Sync(); err != nil {
		return errors.Join(fmt.Errorf("mcp lock file: %w", err), tmp.Close())
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("mcp lock file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("mcp lock file: %w", err)
	}
	return nil
}

// Confirm records def, as upstream lists it now, as the confirmed
// definition of its tool.
func (l *Lock) Confirm(upstream string, def *mcp.Tool, by string, at time.Time) (LockedTool, error) {
	raw, digest, err := definitionOf(def)
	if err != nil {
		return LockedTool{}, err
	}
	t := LockedTool{Upstream: upstream, Tool: def.Name, Digest: digest, Definition: raw, ConfirmedBy: by, ConfirmedAt: at.UTC()}
	l.Tools[clientName(upstream, def.Name)] = t
	return t, nil
}

// Names are the confirmed tools' client names, sorted.
func (l *Lock) Names() []string {
	out := make([]string, 0, len(l.Tools))
	for n := range l.Tools {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// definitionOf is a tool's definition as the lock keeps it (canonical
// JSON of everything the upstream said of the tool) and its digest.
func definitionOf(def *mcp.Tool) (json.RawMessage, ledger.Digest, error) {
	raw, err := json.Marshal(def)
	if err != nil {
		return nil, "", fmt.Errorf("tool %s: definition: %w", def.Name, err)
	}
	canon, err := ledger.Canonicalize(raw)
	if err != nil {
		return nil, "", fmt.Errorf("tool %s: definition: %w", def.Name, err)
	}
	return canon, ledger.DigestCanonical(canon), nil
}

// clientName is the name clients see of an upstream's tool.
func clientName(upstream, tool string) string { return upstream + "__" + tool }
