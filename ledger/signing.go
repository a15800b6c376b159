package ledger

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// Signed chain heads. A store given a signing key (Config.SigningKey)
// signs each run's chain head whenever a write moves it, in the same
// transaction, and keeps the newest signature beside the run. The key
// stays in the process: it is never stored, logged or shown; only its id
// is.
//
// What a signature over (run, seq, hash, signed_at) proves: whoever held
// the key saw run's chain hold exactly seq events ending in hash at
// signed_at. Since each event's hash covers its predecessor's and the
// digests of the rows its write changed, a chain (and the rows of a report)
// that recomputes to a signed head is what the ledger wrote, up to that
// event: rewriting events, rows and the head together in the database, or
// in a report, no longer goes unnoticed without the key. What it does not
// prove: that the chain ended there — someone who can write the database
// and kept an older signature can cut the chain back to that older signed
// head (signed_at then shows how old it is, and a later report of the same
// run shows more events); that events after the signed head are genuine (a
// process without the key writes them unsigned, and verification says the
// signature covers fewer events than the chain holds); or anything at all
// once the key has leaked.

// headSignaturePurpose separates the ledger's head signatures from
// anything else the same key might sign.
const headSignaturePurpose = "actionledger chain head v1"

// HeadSignature is a signature of a run's chain head.
type HeadSignature struct {
	RunID    RunID     `json:"run_id"`
	Seq      int64     `json:"seq"`
	Hash     string    `json:"hash"`
	SignedAt time.Time `json:"signed_at"`
	// KeyID names the public key that verifies it (SigningKeyID).
	KeyID     string `json:"key_id"`
	Signature []byte `json:"signature"`
}

// SigningKeyID names a public key: the first 16 hex digits of the SHA-256
// of its 32 bytes.
func SigningKeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Message is what the signature signs: the canonical JSON of the head with
// a fixed purpose, {"hash", "purpose", "run_id", "seq", "signed_at"}.
func (h *HeadSignature) Message() []byte {
	var o canonObject
	o.str("hash", h.Hash)
	o.str("purpose", headSignaturePurpose)
	o.str("run_id", string(h.RunID))
	o.int("seq", h.Seq)
	o.time("signed_at", h.SignedAt)
	msg := bytes.Clone(o.close())
	o.release()
	return msg
}

// SignHead signs the head (seq, hash) of run's chain at the time at.
func SignHead(key ed25519.PrivateKey, run RunID, seq int64, hash string, at time.Time) *HeadSignature {
	h := &HeadSignature{RunID: run, Seq: seq, Hash: hash, SignedAt: at.UTC(),
		KeyID: SigningKeyID(key.Public().(ed25519.PublicKey))}
	h.Signature = ed25519.Sign(key, h.Message())
	return h
}

// Verify checks the signature against pub: CodeInvalid if it was made by
// another key or does not match the head it claims.
func (h *HeadSignature) Verify(pub ed25519.PublicKey) error {
	if len(pub) != ed25519.PublicKeySize {
		return Errorf(CodeInvalid, "public key has %d bytes, not %d", len(pub), ed25519.PublicKeySize)
	}
	if id := SigningKeyID(pub); h.KeyID != id {
		return Errorf(CodeInvalid, "the head of run %s was signed by key %s, not by the given key %s", h.RunID, h.KeyID, id)
	}
	if !ed25519.Verify(pub, h.Message(), h.Signature) {
		return Errorf(CodeInvalid, "the signature of run %s's head (event %d, %s) does not verify with key %s: "+
			"the head, its time or the signature was changed", h.RunID, h.Seq, h.Hash, h.KeyID)
	}
	return nil
}

// VerifySignedHead checks that sig is pub's signature of the head (seq,
// hash) of run's chain, as a chain verified to end there: CodeInvalid,
// with what is wrong, if there is no signature, it is another key's, it
// does not verify, or it signs another head (events added after it or cut
// from the end, or another chain).
func VerifySignedHead(sig *HeadSignature, pub ed25519.PublicKey, run RunID, seq int64, hash string) error {
	switch {
	case sig == nil:
		return Errorf(CodeInvalid, "the head of run %s is not signed", run)
	case sig.RunID != run:
		return Errorf(CodeInvalid, "the signature is of run %s, not %s", sig.RunID, run)
	}
	if err := sig.Verify(pub); err != nil {
		return err
	}
	switch {
	case sig.Seq < seq:
		return Errorf(CodeInvalid, "the signature covers events 1–%d of run %s, but the chain holds %d: "+
			"events %d–%d were written without the signing key, or added by someone else", sig.Seq, run, seq, sig.Seq+1, seq)
	case sig.Seq > seq:
		return Errorf(CodeInvalid, "the signature covers %d events of run %s, but the chain holds %d: events were removed",
			sig.Seq, run, seq)
	case sig.Hash != hash:
		return Errorf(CodeInvalid, "the signature of run %s's event %d is of hash %s, but the chain's is %s: the chain was rewritten",
			run, seq, sig.Hash, hash)
	}
	return nil
}

// signer signs chain heads for a store.
type signer struct {
	key ed25519.PrivateKey
	id  string
}

func newSigner(key ed25519.PrivateKey) (*signer, error) {
	if key == nil {
		return nil, nil
	}
	if len(key) != ed25519.PrivateKeySize {
		return nil, Errorf(CodeInvalid, "signing key has %d bytes, not %d", len(key), ed25519.PrivateKeySize)
	}
	return &signer{key: key, id: SigningKeyID(key.Public().(ed25519.PublicKey))}, nil
}

// sign records the signature of run's head (seq, hash).
func (tx *txn) sign(run RunID, seq int64, hash string) error {
	h := SignHead(tx.signer.key, run, seq, hash, tx.now)
	if err := tx.write(func(d Tx) error { return d.PutSignature(tx.ctx, h) }); err != nil {
		return fmt.Errorf("sign chain head of run %s: %w", run, err)
	}
	return nil
}
