package mcpgw

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/actionledger/ledger/ledger"
)

// requestState is what a client of the 2026-07-28 revision hands back
// with a call after an input-required result: the action it waited for,
// bound to its digest, the caller and an expiry, under the gateway's HMAC
// key, so that the call joins that action and no other.
type requestState struct {
	Action    ledger.ActionID `json:"a"`
	Digest    ledger.Digest   `json:"d"`
	Tenant    string          `json:"t"`
	Principal string          `json:"p"`
	Expires   int64           `json:"e"` // unix seconds
}

// errBadState is the error of a request state that is forged, altered,
// expired or another caller's.
var errBadState = errors.New("the request state is not one this gateway gave this caller, or it has expired: call again without it")

// seal is s as the client carries it: base64url(JSON) "." base64url(HMAC).
func (s requestState) seal(key []byte) string {
	body, _ := json.Marshal(s)
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return base64.RawURLEncoding.EncodeToString(body) + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// openState checks a request state and returns it: its HMAC is the
// gateway's, it is this caller's, it has not expired.
func openState(key []byte, sealed string, tenant, principal string, now time.Time) (requestState, error) {
	body64, mac64, ok := strings.Cut(sealed, ".")
	if !ok || len(sealed) > 4096 {
		return requestState{}, errBadState
	}
	body, err1 := base64.RawURLEncoding.DecodeString(body64)
	mac, err2 := base64.RawURLEncoding.DecodeString(mac64)
	if err1 != nil || err2 != nil {
		return requestState{}, errBadState
	}
	m := hmac.New(sha256.New, key)
	m.Write(body)
	if !hmac.Equal(mac, m.Sum(nil)) {
		return requestState{}, errBadState
	}
	var s requestState
	if json.Unmarshal(body, &s) != nil || s.Tenant != tenant || s.Principal != principal || now.Unix() > s.Expires {
		return requestState{}, errBadState
	}
	return s, nil
}
