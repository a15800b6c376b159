package ledger

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPragmas checks that both pools run with the settings DESIGN.md section
// 9 asks for; synchronous and foreign_keys are per connection.
func TestPragmas(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, Config{Path: filepath.Join(t.TempDir(), "ledger.db")})
	require.NoError(t, err)
	defer s.Close()
	pragma := func(t *testing.T, reader bool, p string) (v string) {
		db := s.w
		if reader {
			db = s.r
		}
		require.NoError(t, db.WithContext(ctx).Raw("PRAGMA "+p).Row().Scan(&v))
		return v
	}
	for _, reader := range []bool{false, true} {
		require.Equal(t, "wal", pragma(t, reader, "journal_mode"))
		require.Equal(t, "2", pragma(t, reader, "synchronous"), "FULL")
		require.Equal(t, "1", pragma(t, reader, "foreign_keys"))
		require.Equal(t, "5000", pragma(t, reader, "busy_timeout"))
		require.Equal(t, "2", pragma(t, reader, "temp_store"), "MEMORY, from the driver's connect hook")
	}
	require.Equal(t, "1", pragma(t, true, "query_only"), "readers cannot write")
	require.Equal(t, "0", pragma(t, false, "query_only"))
	sqlDB, err := s.w.DB()
	require.NoError(t, err)
	require.Equal(t, 1, sqlDB.Stats().MaxOpenConnections, "one writer connection")
}
