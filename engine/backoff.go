package engine

import (
	"math/rand/v2"
	"time"

	"github.com/actionledger/ledger/storehealth"
)

// Defaults of the retry backoff and of the failure log.
const (
	defaultRetryMin    = 100 * time.Millisecond
	defaultRetryMax    = 30 * time.Second
	defaultLogInterval = storehealth.DefaultLogInterval
)

// backoff spaces the retries of something that keeps failing: a run whose
// Advance fails, or the pool's pass over the store.
type backoff struct {
	min, max time.Duration
	// jitter returns a random duration in [0, d); nil means math/rand/v2.
	jitter func(d time.Duration) time.Duration
}

// delay is the wait after the n-th failure in a row (n ≥ 1): min·2^(n-1),
// capped at max, of which the upper half is random. Never less than half
// the schedule, so no retry comes much sooner than it says; spread over the
// other half, so runs that failed together (a full disk fails them all)
// do not retry together.
func (b backoff) delay(n int) time.Duration {
	d := b.min
	for i := 1; i < n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	half := d / 2
	if d-half <= 0 {
		return d
	}
	j := b.jitter
	if j == nil {
		j = rand.N[time.Duration]
	}
	return half + j(d-half)
}
