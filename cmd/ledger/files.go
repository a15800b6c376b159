package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/actionledger/ledger/server"
)

// warningLogger logs warnings and errors to w as text lines: the start-up
// warnings of commands whose own log is discarded (worker, recover, demo).
func warningLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// noteSymlink warns on log when path, the file a command reads as what,
// is a symlink, naming what it leads to: the checks of the file's
// permissions are of that target. Symlinks are followed, not refused, so
// that secrets mounted as links (Kubernetes' are) keep working.
func noteSymlink(log *slog.Logger, what, path string) {
	st, err := os.Lstat(path)
	if err != nil || st.Mode()&fs.ModeSymlink == 0 {
		return // reading it says what is wrong
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		target = fmt.Sprintf("(does not resolve: %v)", err)
	}
	log.Warn(what+" is a symlink: its target is read, and its target's permissions checked", "file", path, "target", target)
}

// loadTokens reads the tokens file of serve, at start-up and on SIGHUP
// (server.LoadTokens: no empty list, no file others may write), saying on
// log when it is a symlink.
func loadTokens(log *slog.Logger, path string) (*server.Tokens, error) {
	noteSymlink(log, "tokens file", path)
	tokens, err := server.LoadTokens(path)
	if errors.Is(err, server.ErrNoTokens) {
		return nil, fmt.Errorf("%w (add one with: ledger token new --add-to %s; to shut everyone out, stop the server)", err, path)
	}
	return tokens, err
}
