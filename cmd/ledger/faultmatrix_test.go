package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFaultMatrixWrites(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"path":   {"--path", "nope"},
		"at":     {"--at", "during_commit"},
		"stride": {"--stride", "0"},
	} {
		t.Run("ErrUsage/"+name, func(t *testing.T) {
			_, _, err := runCLI(t, nil, append([]string{"faultmatrix", "writes", "--binary", "/nonexistent"}, args...)...)
			requireExit(t, err, 2)
		})
	}
	// The command, end to end: it strikes write 1 and then 101, which a
	// run never reaches. Every write of every loop is struck once, in
	// faultmatrix's TestCrashAtEveryWrite; this is not run twice.
	t.Run("OK", func(t *testing.T) {
		out, progress, err := runCLI(t, nil, "faultmatrix", "writes", "--binary", ledgerBinary(t), "--path", "auto",
			"--at", "after_commit", "--stride", "100")
		require.NoError(t, err, progress)
		require.Regexp(t, `auto +after_commit +last write struck +\d+, +\d+ crashes`, out)
		require.Contains(t, out, "0 failed")
		require.Contains(t, progress, "not reached: the end")
	})
}
