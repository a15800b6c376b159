package main

import (
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/actionledger/ledger/server"
)

// reloadTokensOnHUP makes SIGHUP re-read the tokens file at path into srv
// until stop is called: an operator revokes or adds a token (ledger token
// revoke, token new --add-to) and sends SIGHUP, with no restart and no
// request dropped. A file that does not parse changes nothing: the tokens
// in force stay, and the error is logged. In dev mode (path "") there is
// no file, and SIGHUP is logged and ignored. Either way SIGHUP no longer
// ends the process.
func reloadTokensOnHUP(log *slog.Logger, srv *server.Server, path string) (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-hup:
				reloadTokens(log, srv, path)
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(quit)
		<-done
	}
}

// reloadTokens reads the tokens file again and swaps it in whole.
func reloadTokens(log *slog.Logger, srv *server.Server, path string) {
	if path == "" {
		log.Warn("SIGHUP ignored: dev mode has no tokens file to reload")
		return
	}
	tokens, err := loadTokens(log, path)
	if err == nil {
		err = srv.SetTokens(tokens)
	}
	if err != nil {
		log.Error("tokens not reloaded; the tokens in force stay", "file", path, "err", err)
		return
	}
	log.Info("tokens reloaded", "file", path, "tokens", tokens.Len())
}
