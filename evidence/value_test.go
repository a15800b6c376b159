package evidence_test

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/actionledger/ledger/evidence"
	"github.com/actionledger/ledger/ledger"
	"github.com/stretchr/testify/require"
)

// testReports are reports with every optional fact absent and with every
// one present: the golden run's, a fresh run's, one of a tampered chain, and
// the golden one with every pointer flipped and text that JSON escapes.
func testReports(t *testing.T) map[string]*evidence.Report {
	t.Helper()
	ctx := context.Background()
	f := openFixture(t)
	id := goldenRun(t, f)
	golden, err := evidence.Build(ctx, f.store, id, f.options(t))
	require.NoError(t, err)

	empty := openFixture(t)
	sub, err := empty.store.SubmitRun(ctx, ledger.SubmitRunParams{Tenant: "acme", IdempotencyKey: "k",
		Principal: "alice", Agent: "practice-cards", Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	fresh, err := evidence.Build(ctx, empty.store, sub.Run.ID, empty.options(t))
	require.NoError(t, err)

	broken := openFixture(t)
	bid := goldenRun(t, broken)
	tamper(t, broken.path, bid, 22)
	tampered, err := evidence.Build(ctx, broken.store, bid, broken.options(t))
	require.NoError(t, err)
	require.False(t, tampered.Chain.OK)

	flipped, err := evidence.Build(ctx, f.store, id, f.options(t))
	require.NoError(t, err)
	flipPointers(reflect.ValueOf(flipped).Elem())
	flipped.Run.SubmittedBy = "<b>a & b</b>\u2028\"quoted\"\t\\ é 😀 \x7f\x01 \xff"
	flipped.Timeline[0].Data = json.RawMessage(` { "b" : [1.50, -0, 1e3, "x\u0001", "\u2028<&>"], "a": {"nested": null, "e": {}, "l": []} } ` + "\n\t ")
	return map[string]*evidence.Report{"golden": golden, "fresh": fresh, "tampered": tampered, "flipped": flipped}
}

// TestValueIsDecodedJSON: the value JSON validates is what the text it
// writes decodes to.
func TestValueIsDecodedJSON(t *testing.T) {
	for name, rep := range testReports(t) {
		t.Run(name, func(t *testing.T) {
			// The text as JSON writes it, whether or not the schema
			// would let it (flipped ids do not match their patterns).
			text, err := evidence.ReportMarshal(rep)
			require.NoError(t, err)
			d := json.NewDecoder(bytes.NewReader(text))
			d.UseNumber()
			var want any
			require.NoError(t, d.Decode(&want))
			got, err := evidence.ReportValue(rep)
			require.NoError(t, err)
			require.Equal(t, want, any(got))
		})
	}
}

// flipPointers walks v (structs and slices of them) and sets every nil
// pointer to a value and every other pointer to nil.
func flipPointers(v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		p := reflect.New(v.Type().Elem())
		switch e := p.Elem(); {
		case e.Type() == reflect.TypeFor[time.Time]():
			e.Set(reflect.ValueOf(time.Date(2026, 2, 3, 4, 5, 6, 789000, time.UTC)))
		case e.Kind() == reflect.String:
			e.SetString("run_00000000000000000000000042")
		case e.Kind() == reflect.Int64:
			e.SetInt(42)
		case e.Kind() == reflect.Struct:
			flipPointers(e)
		}
		v.Set(p)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			return
		}
		for i := range v.NumField() {
			flipPointers(v.Field(i))
		}
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			return
		}
		for i := range v.Len() {
			flipPointers(v.Index(i))
		}
	}
}
