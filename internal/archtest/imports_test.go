package archtest

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/actionledger/ledger"

// allowed lists, per package of ours, the packages of ours it may import.
// A package missing here is a test failure: add it with its place in the
// layering. Test-only packages (ledgertest, storetest, archtest) import what
// they test.
var allowed = map[string][]string{
	"contracts": {},
	"redact":    {},
	// Model adapters and the fallback chain: the engine builds on it.
	"provider":          {},
	"ledger":            {"contracts"},
	"ledger/ledgertest": {"ledger", "contracts", "ledger/sqlite"},
	// Storage drivers: the ledger's rules stay in ledger, over their seam.
	// What both SQL drivers share (rows, conversions, common statements;
	// the migration runner) sits under ledger/internal, below them.
	"ledger/sqlite":           {"ledger", "ledger/internal/sqlrows", "ledger/internal/migrate"},
	"ledger/postgres":         {"ledger", "ledger/internal/sqlrows", "ledger/internal/migrate"},
	"ledger/postgres/pgtest":  {},
	"ledger/internal/sqlrows": {"ledger"},
	"ledger/internal/migrate": {"ledger"},
	// Opens the Store on the driver a database's name selects.
	"ledger/stores": {"ledger", "ledger/sqlite", "ledger/postgres"},
	// The Store conformance suite every driver runs from its tests.
	"ledger/storetest": {"ledger", "ledger/ledgertest"},
	"approval":         {"ledger", "contracts", "redact"},
	"budget":           {"ledger", "contracts"},
	"config":           {"ledger", "contracts", "budget"},
	"evidence":         {"ledger", "contracts", "redact"},
	"recovery":         {"ledger", "contracts"},
	"storehealth":      {"ledger"},
	"simulator":        {"ledger", "contracts", "approval", "budget", "recovery", "engine", "redact"},
	"engine":           {"ledger", "contracts", "approval", "budget", "recovery", "redact", "storehealth"},
	// The MCP gateway: a front end on the engine's one propose path.
	"mcpgw":             {"ledger", "contracts", "budget", "engine"},
	"server":            {"ledger", "contracts", "approval", "budget", "recovery", "engine", "evidence", "simulator", "redact", "storehealth", "mcpgw"},
	"perf":              {"ledger", "ledger/sqlite", "ledger/postgres", "ledger/stores", "contracts", "approval", "recovery", "engine", "evidence", "simulator", "server"},
	"faultmatrix":       {"*"},
	"cmd/ledger":        {"*"},
	"internal/archtest": {},
	// An outside program embedding the ledger: the library's packages
	// only, never the command's wiring or the simulator.
	"examples/go-agent": {"ledger", "ledger/sqlite", "contracts", "approval", "engine"},
	// Test support of the HTTP API; it reads the server over HTTP only,
	// and checks answers against the contracts too.
	"server/servertest": {"contracts"},
	// The MCP test upstream: the simulator's tools served over MCP.
	"simulator/mcpupstream": {"simulator", "engine", "ledger", "contracts"},
	// The executor of http tools: the engine's Tool over HTTP.
	"httptool": {"engine", "ledger", "contracts"},
	// The simulator's tools served as http tools; its wire types are its
	// own, so it does not import httptool.
	"simulator/httpupstream": {"simulator", "engine", "ledger"},
	// The generator of openapi.json's component schemas, from the server's
	// wire types, and the command `go generate ./server` runs.
	"server/internal/openapigen":                {"server", "ledger", "contracts", "engine"},
	"server/internal/openapigen/cmd/openapigen": {"server/internal/openapigen"},
}

// testOnly lists packages of ours that only tests may import.
var testOnly = []string{"ledger/ledgertest", "ledger/storetest", "ledger/postgres/pgtest", "server/servertest"}

// owners lists third-party imports only some packages may use: the
// database libraries belong to the storage drivers, nothing else.
var owners = map[string][]string{
	"gorm.io/gorm":            {"ledger/sqlite", "ledger/postgres"},
	"gorm.io/driver/sqlite":   {"ledger/sqlite"},
	"gorm.io/driver/postgres": {"ledger/postgres"},
	// perf: the raw commit floor of PostgreSQL, beside the ledger's driver.
	"github.com/jackc/pgx/v5":                  {"ledger/postgres", "ledger/postgres/pgtest", "perf"},
	"github.com/labstack/echo/v4":              {"server"},
	"github.com/santhosh-tekuri/jsonschema/v5": {"contracts"},
	"sigs.k8s.io/yaml":                         {"contracts"},
	"go.yaml.in/yaml/v3":                       {"contracts"},
	// A module path here covers its packages too.
	"github.com/getkin/kin-openapi": {"server/servertest"},
	"github.com/invopop/jsonschema": {"server/internal/openapigen"},
	// The model providers' SDKs: the adapters alone.
	"github.com/openai/openai-go/v3":            {"provider"},
	"github.com/anthropics/anthropic-sdk-go/v2": {"provider"},
	// The MCP SDK: the gateway, the test upstream, and the commands and
	// tests that start or call them.
	"github.com/modelcontextprotocol/go-sdk": {"mcpgw", "simulator/mcpupstream", "cmd/ledger", "server", "faultmatrix", "perf"},
}

// ownersOf returns the packages of ours that may import imp, if it is
// owned.
func ownersOf(imp string) ([]string, bool) {
	for path, owner := range owners {
		if imp == path || strings.HasPrefix(imp, path+"/") {
			return owner, true
		}
	}
	return nil, false
}

type pkg struct {
	ImportPath string
	Imports    []string
}

func TestImportDirection(t *testing.T) {
	cmd := exec.Command("go", "list", "-json", module+"/...")
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	dec := json.NewDecoder(out)
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else {
			require.NoError(t, err)
		}
		pkgs = append(pkgs, p)
	}
	require.NoError(t, cmd.Wait())
	require.NotEmpty(t, pkgs)

	for _, p := range pkgs {
		name := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		may, known := allowed[name]
		if !known {
			t.Errorf("package %s has no place in the layering: add it to allowed", name)
			continue
		}
		for _, imp := range p.Imports {
			if owner, ok := ownersOf(imp); ok && !slices.Contains(owner, name) {
				t.Errorf("%s imports %s, which only %s may use", name, imp, strings.Join(owner, ", "))
			}
			ours, isOurs := strings.CutPrefix(imp, module+"/")
			if isOurs && slices.Contains(testOnly, ours) && !slices.Contains(testOnly, name) {
				t.Errorf("%s imports %s, which only tests may import", name, ours)
			}
			if !isOurs || slices.Contains(may, "*") {
				continue
			}
			if !slices.Contains(may, ours) {
				t.Errorf("%s imports %s, against the direction ARCHITECTURE.md sets", name, ours)
			}
		}
	}
}
