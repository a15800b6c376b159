//go:build !faultmatrix_broken

package simulator

// broken reports a deliberately broken behaviour of a test build. Normal
// builds have none; see broken_on.go.
func broken(string) bool { return false }
