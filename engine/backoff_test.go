package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffDelay(t *testing.T) {
	low := backoff{min: 100 * time.Millisecond, max: 30 * time.Second, jitter: func(time.Duration) time.Duration { return 0 }}
	high := low
	high.jitter = func(d time.Duration) time.Duration { return d - 1 }
	for _, tc := range []struct {
		n         int
		low, high time.Duration
	}{
		{1, 50 * time.Millisecond, 100*time.Millisecond - 1},
		{2, 100 * time.Millisecond, 200*time.Millisecond - 1},
		{3, 200 * time.Millisecond, 400*time.Millisecond - 1},
		{9, 12800 * time.Millisecond, 25600*time.Millisecond - 1},
		{10, 15 * time.Second, 30*time.Second - 1}, // 51.2s capped
		{64, 15 * time.Second, 30*time.Second - 1}, // no overflow however many
		{1000, 15 * time.Second, 30*time.Second - 1},
	} {
		t.Run(fmt.Sprintf("n=%d", tc.n), func(t *testing.T) {
			require.Equal(t, tc.low, low.delay(tc.n), "the lower half is never cut")
			require.Equal(t, tc.high, high.delay(tc.n))
		})
	}
	t.Run("RandomJitterInRange", func(t *testing.T) {
		b := backoff{min: 100 * time.Millisecond, max: time.Second}
		seen := map[time.Duration]bool{}
		for range 200 {
			d := b.delay(3)
			require.GreaterOrEqual(t, d, 200*time.Millisecond)
			require.Less(t, d, 400*time.Millisecond)
			seen[d] = true
		}
		require.Greater(t, len(seen), 100, "retries of runs that failed together spread out")
	})
	t.Run("TinyMin", func(t *testing.T) {
		b := backoff{min: 1, max: 1}
		require.LessOrEqual(t, b.delay(1), time.Duration(1), "no panic on a range of one")
	})
}
