package sqlite

import "testing"

// TestTranslateNilAllocatesNothing: every statement's error passes through
// translate, nearly always nil.
func TestTranslateNilAllocatesNothing(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _ = translate(nil) }); n != 0 {
		t.Fatalf("translate(nil) allocates %v times", n)
	}
}
