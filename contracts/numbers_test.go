package contracts_test

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/contracts"
)

// TestValidateNumbers: numbers the schema library cannot check exactly, or
// only at great cost, and numbers no IEEE 754 double holds are refused at
// their location, in any schema and in a tool's arguments; ordinary
// numbers of every spelling pass.
func TestValidateNumbers(t *testing.T) {
	rules := func(ttl string) []byte {
		return []byte(`{"schema_version":"1.0","rules":[{"tool":"*","decision":"require_approval","approval_ttl_ms":` + ttl + `}]}`)
	}
	for _, ok := range []string{"5", "3600000", "315360000000", "1e3", "1E+3", "-0", "0.5e1"} {
		t.Run("OK/"+ok, func(t *testing.T) {
			err := contracts.Validate(contracts.SchemaRules, rules(ok))
			if err != nil {
				require.NotContains(t, err.Error(), "number", "%s is an ordinary number", ok)
			}
		})
	}
	for name, tc := range map[string]struct{ number, msg string }{
		"HugeExponent": {"1e1000001", "exponent beyond ±1000"},
		"TinyExponent": {"1e-1000001", "exponent beyond ±1000"},
		"LongExponent": {"1e" + strings.Repeat("9", 30), "exponent beyond ±1000"},
		"BeyondDouble": {"1e400", "out of range of an IEEE 754 double"},
		"ManyDigits":   {strings.Repeat("9", 101), "longer than 100 characters"},
	} {
		t.Run("ErrInvalid/"+name, func(t *testing.T) {
			err := contracts.Validate(contracts.SchemaRules, rules(tc.number))
			require.ErrorIs(t, err, contracts.ErrInvalid)
			requireIssue(t, err, "/rules/0/approval_ttl_ms", tc.msg)
			require.Less(t, len(err.Error()), 200, "the message does not repeat the number")
		})
	}
	t.Run("ErrInvalid/NotFinite", func(t *testing.T) {
		err := contracts.ValidateValue(contracts.SchemaRules, map[string]any{"schema_version": "1.0",
			"rules": []any{map[string]any{"tool": "*", "decision": "require_approval", "approval_ttl_ms": math.Inf(1)}}})
		requireIssue(t, err, "/rules/0/approval_ttl_ms", "not a finite number")
	})
	t.Run("ErrInvalid/Arguments", func(t *testing.T) {
		d, err := contracts.ParseToolDescriptor(readTestdata(t, "tool_descriptor.cards_write.json"))
		require.NoError(t, err)
		v, err := d.ArgumentValidator()
		require.NoError(t, err)
		err = v.Validate([]byte(`{"title":"t","cards":[{"front":"q","back":"a","n":1e1000001}]}`))
		requireIssue(t, err, "/cards/0/n", "exponent")
	})
}
