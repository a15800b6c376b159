package evidence_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/actionledger/ledger/evidence"
)

// FuzzReadReport fuzzes the decoder of report files that `ledger evidence
// verify --report` reads from anyone: whatever the bytes, ReadReport and
// Verify refuse with a *VerifyError or accept, never panic; the golden
// report verifies; and a report that verifies still verifies after its
// JSON is written again and read back.
func FuzzReadReport(f *testing.F) {
	golden, err := os.ReadFile(filepath.Join("testdata", "TestReport", "json.golden"))
	require.NoError(f, err)
	f.Add(golden)
	f.Add(bytes.Replace(golden, []byte(`"decided_by": "bob"`), []byte(`"decided_by": "mallory"`), 1))
	f.Add(bytes.Replace(golden, []byte(`"seq": 2,`), []byte(`"seq": 3,`), 1))
	f.Add(golden[:len(golden)/2])
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"schema_version": "1.1"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var verr *evidence.VerifyError
		r, err := evidence.ReadReport(data)
		if err != nil {
			require.True(t, errors.As(err, &verr), "a refusal is a VerifyError: %v", err)
			require.NotEmpty(t, err.Error())
			return
		}
		_, err = r.Verify(nil)
		if bytes.Equal(data, golden) {
			require.NoError(t, err, "the golden report verifies")
		}
		if err != nil {
			require.True(t, errors.As(err, &verr), "a failed check is a VerifyError: %v", err)
			return
		}
		var again bytes.Buffer
		require.NoError(t, r.JSON(&again))
		r2, err := evidence.ReadReport(again.Bytes())
		require.NoError(t, err, "a report that verified reads back")
		_, err = r2.Verify(nil)
		require.NoError(t, err, "and verifies again")
	})
}
