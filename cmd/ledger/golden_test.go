package main

import (
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// update rewrites the golden files of the CLI's output: go test ./cmd/ledger -run X -update
var update = flag.Bool("update", false, "rewrite testdata/<Test>/<case>.golden")

// Output of a real server carries fresh ids, times and random keys; they
// become placeholders of the same width, so tables keep their alignment.
var unstable = []struct {
	re   *regexp.Regexp
	with func(string) string
}{
	{regexp.MustCompile(`\b(run|act|att|apr|evt|obs)_[0-9A-HJKMNP-TV-Z]{26}\b`), func(m string) string {
		prefix, _, _ := strings.Cut(m, "_")
		return prefix + "_" + strings.Repeat("X", 26)
	}},
	{regexp.MustCompile(`\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\b`), func(string) string { return "YYYY-MM-DDThh:mm:ssZ" }},
	{regexp.MustCompile(`\bcli-[A-Z2-7]{26}\b`), func(string) string { return "cli-" + strings.Repeat("K", 26) }},
}

func normalize(s string) string {
	for _, u := range unstable {
		s = u.re.ReplaceAllStringFunc(s, u.with)
	}
	return s
}

// golden compares got, normalized, with testdata/<Test>/<name>.golden.
func golden(t *testing.T, name, got string) {
	t.Helper()
	test, _, _ := strings.Cut(t.Name(), "/")
	path := filepath.Join("testdata", test, name+".golden")
	got = normalize(got)
	if *update {
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run with -update to create it")
	require.Equal(t, string(want), got, "golden file %s (run with -update to rewrite)", path)
}
