package perf

import (
	"net/http/httptest"

	"github.com/actionledger/ledger/approval"
	"github.com/actionledger/ledger/contracts"
	"github.com/actionledger/ledger/engine"
	"github.com/actionledger/ledger/ledger"
	"github.com/actionledger/ledger/server"
)

// serve is the server a workload measures over HTTP: the default rules,
// separation of duties relaxed (dev mode: no tokens), an engine with the
// agents given that is never started (nothing but the workload's requests
// runs in it), behind an httptest server on loopback.
func serve(store ledger.Store, agents ...engine.Agent) (*engine.Engine, *httptest.Server, error) {
	tools := map[string]contracts.ToolDescriptor{}
	for _, a := range agents {
		for _, t := range a.Tools {
			tools[t.Descriptor().Name] = t.Descriptor()
		}
	}
	policy, err := approval.NewPolicy(nil, approval.Defaults{})
	if err != nil {
		return nil, nil, err
	}
	svc := approval.NewService(store, policy, func(n string) (contracts.ToolDescriptor, bool) { d, ok := tools[n]; return d, ok },
		approval.Options{RelaxSeparationOfDuties: true})
	eng, err := engine.New(engine.Config{Store: store, Approvals: svc, Agents: agents})
	if err != nil {
		return nil, nil, err
	}
	srv, err := server.New(server.Config{Store: store, Engine: eng, Approvals: svc})
	if err != nil {
		return nil, nil, err
	}
	return eng, httptest.NewServer(srv.Handler()), nil
}
