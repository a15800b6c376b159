package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/ledger"
)

// Role is what a principal may do in its tenant (docs/security.md).
type Role string

// Roles. Admin holds every other role.
const (
	// RoleSubmitter submits runs, and reads and cancels its own.
	RoleSubmitter Role = "submitter"
	// RoleApprover reads the tenant's runs, actions and approvals, and
	// approves, denies and resolves.
	RoleApprover Role = "approver"
	// RoleAuditor reads everything of the tenant, timelines and evidence
	// included, and writes nothing.
	RoleAuditor Role = "auditor"
	// RoleAgent drives the runs of the agents its token is bound to
	// (Identity.Agents): it submits them, reads and cancels them, and
	// reports their tool calls (docs/agent-protocol.md). It never approves,
	// denies or resolves.
	RoleAgent Role = "agent"
	// RoleAdmin may do all of the above, for every agent.
	RoleAdmin Role = "admin"
)

// Roles lists every role in a fixed order.
func Roles() []Role { return []Role{RoleSubmitter, RoleApprover, RoleAuditor, RoleAgent, RoleAdmin} }

// roleNames is Roles as text, for messages.
func roleNames() string {
	names := make([]string, 0, len(Roles()))
	for _, r := range Roles() {
		names = append(names, string(r))
	}
	return strings.Join(names, ", ")
}

// Valid reports whether r is a known role.
func (r Role) Valid() bool { return slices.Contains(Roles(), r) }

// Identity is who a request acts as. It and the request's id
// (requestid.go) are the only values the server keeps in a request's
// context.
type Identity struct {
	Principal string
	Tenant    string
	Roles     []Role
	// Agents are the agents a principal with RoleAgent drives; empty for
	// any other. An admin drives every agent without naming them.
	Agents []string
}

// key is the identity as one key: its principal in its tenant. The rate
// limit and the caps on streams and long-polls count by it.
func (id Identity) key() string { return id.Tenant + "\x00" + id.Principal }

// same reports whether id and o stand for the same principal with the same
// roles and agents.
func (id Identity) same(o Identity) bool {
	return id.Principal == o.Principal && id.Tenant == o.Tenant && slices.Equal(id.Roles, o.Roles) &&
		slices.Equal(id.Agents, o.Agents)
}

// Has reports whether the identity holds role r; admin holds every role.
func (id Identity) Has(r Role) bool {
	return slices.Contains(id.Roles, r) || slices.Contains(id.Roles, RoleAdmin)
}

// HasAny reports whether the identity holds one of roles.
func (id Identity) HasAny(roles ...Role) bool {
	return slices.ContainsFunc(roles, id.Has)
}

// readsTenant reports whether the identity sees every object of its tenant,
// not only the runs it submitted or drives.
func (id Identity) readsTenant() bool { return id.HasAny(RoleApprover, RoleAuditor) }

// drives reports whether the identity may drive runs of agent, in its
// tenant: an admin every agent, a principal with RoleAgent those it is
// bound to.
func (id Identity) drives(agent string) bool {
	return id.Has(RoleAdmin) || slices.Contains(id.Roles, RoleAgent) && slices.Contains(id.Agents, agent)
}

// seesRun reports whether the identity may read run: one of its tenant's
// that it reads all of (approver, auditor, admin), submitted, or drives.
func (id Identity) seesRun(run *ledger.Run) bool {
	return run.Tenant == id.Tenant && (id.readsTenant() || run.SubmittedBy == id.Principal || id.drives(run.Agent))
}

// mayDrive reports whether id may drive run through the agent protocol:
// report its tool calls, finish it, cancel it. That is an admin, or a
// principal with RoleAgent bound to the run's agent, and either only in the
// run's tenant. Approving, denying and resolving are never driving: they
// need RoleApprover, whatever else the identity holds.
func (s *Server) mayDrive(id Identity, run *ledger.Run) bool {
	return run.Tenant == id.Tenant && id.drives(run.Agent)
}

// mayCancel reports whether id may cancel run: an admin, the principal who
// submitted it, or one that drives it.
func (s *Server) mayCancel(id Identity, run *ledger.Run) bool {
	return run.Tenant == id.Tenant && (id.Has(RoleAdmin) || run.SubmittedBy == id.Principal || s.mayDrive(id, run))
}

// submittableAgent checks that id may submit a run of agent: the agent is
// registered and allows id's tenant (else 400, the answer for an unknown
// agent, so another tenant's agents stay unknown), and id is a submitter
// or drives the agent (else 403 agent_not_bound).
func (s *Server) submittableAgent(id Identity, agent string) error {
	if _, ok := s.engine.AgentFor(agent, id.Tenant); !ok {
		return &apiError{code: string(ledger.CodeInvalid), detail: "unknown agent",
			fields: []FieldError{{Location: "/agent", Message: "no agent " + strconv.Quote(agent) + " is registered"}}}
	}
	if !id.Has(RoleSubmitter) && !id.drives(agent) {
		return problemf(CodeAgentNotBound, "this token drives the agents %s, not %s", strings.Join(id.Agents, ", "), strconv.Quote(agent))
	}
	return nil
}

// findDrivenRuns is findVisibleRuns for an identity that drives agents and
// does not read its whole tenant: up to n of the runs matching f (its
// tenant's) that it submitted or drives. The store filters by tenant and
// cursor; the agent is filtered here, a page of the tenant's runs at a
// time.
func (s *Server) findDrivenRuns(ctx context.Context, id Identity, f ledger.RunFilter, n int) ([]*ledger.Run, error) {
	const page = MaxPageSize
	var out []*ledger.Run
	for {
		f.Limit = page
		runs, err := s.store.FindRuns(ctx, f)
		if err != nil {
			return nil, err
		}
		for _, r := range runs {
			if id.seesRun(r) {
				if out = append(out, r); len(out) == n {
					return out, nil
				}
			}
		}
		if len(runs) < page {
			return out, nil
		}
		last := runs[len(runs)-1].ID
		f.AfterID = &last
	}
}

// identityKey is the private context key of the request's Identity.
type identityKey struct{}

// tokenHashKey is the private context key of the hash of the request's
// bearer token; absent in dev mode.
type tokenHashKey struct{}

func withIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// identityFrom returns the request's identity; the auth middleware sets it
// on every /v1 route that needs one.
func identityFrom(c echo.Context) (Identity, bool) {
	id, ok := c.Request().Context().Value(identityKey{}).(Identity)
	return id, ok
}

// TokenEntry is one line of a tokens file: the SHA-256 of a token (64
// lowercase hex digits; the token itself is never stored) and who it
// stands for.
type TokenEntry struct {
	SHA256    string   `json:"sha256"`
	Principal string   `json:"principal"`
	Tenant    string   `json:"tenant"`
	Roles     []string `json:"roles"`
	// Agents are the agents a token with the role agent drives: required
	// with that role, refused without it.
	Agents []string `json:"agents,omitempty"`
}

// TokensFile is the document of a tokens file (docs/security.md):
//
//	{"tokens": [{"sha256": "<64 hex>", "principal": "alice", "tenant": "acme", "roles": ["approver"]},
//	            {"sha256": "<64 hex>", "principal": "bot", "tenant": "acme", "roles": ["agent"], "agents": ["my-agent"]}]}
type TokensFile struct {
	Tokens []TokenEntry `json:"tokens"`
}

// Tokens is a loaded tokens file: a lookup from a token's hash to its
// identity. It is immutable and safe for concurrent use; a server takes a
// new set whole (Server.SetTokens). A nil *Tokens in Config means dev mode.
type Tokens struct {
	byHash map[string]Identity
}

// Len returns how many tokens are known.
func (t *Tokens) Len() int { return len(t.byHash) }

var hashPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ErrNoTokens is a tokens file that lists no tokens, which LoadTokens
// refuses: a server with it would let nobody in.
var ErrNoTokens = errors.New("the file lists no tokens, so nobody could get in")

// ErrTokensFileWritable is a tokens file that group or others may write,
// which LoadTokens refuses: whoever writes it decides who may act.
var ErrTokensFileWritable = errors.New("group or others may write it")

// LoadTokens reads and checks the tokens file a server runs with: what
// ParseTokens checks, and two things more. The file must list at least
// one token (ErrNoTokens), and, where files have Unix permissions, neither
// group nor others may write it (ErrTokensFileWritable); others may read
// it, since it holds only hashes. A symlink is followed: what it leads to
// is read, and its permissions are the ones checked.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load tokens: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("load tokens: %w", err)
	}
	if perm := st.Mode().Perm(); perm&0o022 != 0 && runtime.GOOS != "windows" {
		return nil, fmt.Errorf("load tokens %s: %w (mode %04o), and whoever writes it decides who may act: chmod 600 %s",
			path, ErrTokensFileWritable, perm, path)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("load tokens: %w", err)
	}
	t, err := ParseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("load tokens %s: %w", path, err)
	}
	if t.Len() == 0 {
		return nil, fmt.Errorf("load tokens %s: %w", path, ErrNoTokens)
	}
	return t, nil
}

// ParseTokens checks a tokens file's content: JSON without duplicate keys,
// no unknown fields, a "tokens" array whose entries each have a 64-hex-digit
// lowercase sha256 (unique in the file), a principal and a tenant (non-empty,
// no control characters, at most 256 and 128 bytes), at least one known
// role (submitter, approver, auditor, agent, admin) and, with the role
// agent and only with it, the agents it drives (agent names as a run
// submission gives them). An empty array is accepted here (it is what
// revoking the last token leaves), though LoadTokens refuses it. Errors
// name the entry by index, never a hash.
func ParseTokens(data []byte) (*Tokens, error) {
	if err := ledger.CheckJSON(data); err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	var f struct {
		Tokens *[]TokenEntry `json:"tokens"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("tokens file: unexpected data after the top-level value")
	}
	if f.Tokens == nil {
		return nil, errors.New(`tokens file: "tokens" is required`)
	}
	t := &Tokens{byHash: make(map[string]Identity, len(*f.Tokens))}
	for i, e := range *f.Tokens {
		id, err := checkEntry(e)
		if err != nil {
			return nil, fmt.Errorf("tokens file: tokens[%d]: %w", i, err)
		}
		if _, dup := t.byHash[e.SHA256]; dup {
			return nil, fmt.Errorf("tokens file: tokens[%d]: the same sha256 appears twice", i)
		}
		t.byHash[e.SHA256] = id
	}
	return t, nil
}

// checkEntry validates one entry and returns its identity.
func checkEntry(e TokenEntry) (Identity, error) {
	if !hashPattern.MatchString(e.SHA256) {
		return Identity{}, errors.New("sha256 must be 64 lowercase hex digits")
	}
	return checkIdentity(e.Principal, e.Tenant, e.Roles, e.Agents)
}

// agentNamePattern is an agent's name, as the run_submission schema has it.
var agentNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

func checkIdentity(principal, tenant string, roles, agents []string) (Identity, error) {
	if err := checkName("principal", principal, 256); err != nil {
		return Identity{}, err
	}
	if err := checkName("tenant", tenant, 128); err != nil {
		return Identity{}, err
	}
	if len(roles) == 0 {
		return Identity{}, errors.New("at least one role is required")
	}
	id := Identity{Principal: principal, Tenant: tenant}
	for _, r := range roles {
		if !Role(r).Valid() {
			return Identity{}, fmt.Errorf("unknown role %q (known: %s)", r, roleNames())
		}
		if !slices.Contains(id.Roles, Role(r)) {
			id.Roles = append(id.Roles, Role(r))
		}
	}
	switch agent := slices.Contains(id.Roles, RoleAgent); {
	case agent && len(agents) == 0:
		return Identity{}, errors.New(`the role agent needs "agents": the agents this token drives`)
	case !agent && len(agents) > 0:
		return Identity{}, errors.New(`"agents" go with the role agent only (an admin drives every agent already)`)
	}
	for _, a := range agents {
		if !agentNamePattern.MatchString(a) {
			return Identity{}, fmt.Errorf("agent %q: want an agent's name: lowercase letters, digits, '.', '_' and '-', at most 64", a)
		}
		if !slices.Contains(id.Agents, a) {
			id.Agents = append(id.Agents, a)
		}
	}
	return id, nil
}

func checkName(field, s string, maxLen int) error {
	switch {
	case strings.TrimSpace(s) == "":
		return fmt.Errorf("%s is required", field)
	case len(s) > maxLen:
		return fmt.Errorf("%s is longer than %d bytes", field, maxLen)
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Errorf("%s contains control characters", field)
	}
	return nil
}

// TokenPrefix starts every token NewTokenLine makes, so a leaked token is
// recognisable to secret scanners.
const TokenPrefix = "lgr_"

// NewTokenLine makes a token for principal in tenant with roles, and with
// the role agent the agents it drives: 32 bytes from crypto/rand,
// base64url without padding, after TokenPrefix. It returns the token, to
// hand to the person once, and the entry to add to the tokens file, which
// holds only the token's SHA-256.
func NewTokenLine(principal, tenant string, roles []string, agents ...string) (token string, line TokenEntry, err error) {
	if _, err := checkIdentity(principal, tenant, roles, agents); err != nil {
		return "", TokenEntry{}, fmt.Errorf("new token: %w", err)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", TokenEntry{}, fmt.Errorf("new token: %w", err)
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return token, TokenEntry{SHA256: HashToken(token), Principal: principal, Tenant: tenant,
		Roles: slices.Clone(roles), Agents: slices.Clone(agents)}, nil
}

// HashToken returns the hex SHA-256 of a token, as a tokens file stores it.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// maxTokenLength bounds the bearer token read from a request.
const maxTokenLength = 512

// token68 is RFC 7235's token68: the characters a bearer token may use.
var token68 = regexp.MustCompile(`^[A-Za-z0-9\-._~+/]+=*$`)

// bearer extracts the token of the one Authorization header.
func bearer(r *http.Request) (string, error) {
	vals := r.Header.Values("Authorization")
	switch len(vals) {
	case 0:
		return "", errors.New("missing Authorization header")
	case 1:
	default:
		return "", errors.New("more than one Authorization header")
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	switch {
	case !ok || !strings.EqualFold(scheme, "Bearer"):
		return "", errors.New("the Authorization header must be Bearer <token>")
	case len(tok) > maxTokenLength || !token68.MatchString(tok):
		return "", errors.New("malformed bearer token")
	}
	return tok, nil
}

// authenticate is the middleware of the /v1 routes that need an identity.
// With tokens, the bearer token's hash is looked up; a missing, malformed
// or unknown token is 401 with WWW-Authenticate. The token is never logged.
// Without tokens (dev mode) every request is principal dev in tenant
// default with every role; the caller binds to loopback, and this refuses
// any client whose address is not loopback as well (403), in case it did
// not.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		var id Identity
		// One load per request: a set swapped meanwhile applies to the next.
		tokens := s.tokens.Load()
		if tokens == nil {
			if !loopback(r.RemoteAddr) {
				return forbidden("dev mode serves loopback clients only")
			}
			id = DevIdentity()
		} else {
			known, hash, err := s.lookupToken(r, tokens)
			if err != nil {
				return err
			}
			id = known
			r = r.WithContext(context.WithValue(r.Context(), tokenHashKey{}, hash))
		}
		c.SetRequest(r.WithContext(withIdentity(r.Context(), id)))
		return next(c)
	}
}

// ErrDevMode is SetTokens on a server built without tokens: dev mode cannot
// be left, nor entered, while the server runs.
var ErrDevMode = errors.New("server: dev mode has no tokens to replace")

// SetTokens replaces the tokens the server accepts with t, at once and
// whole: a request authenticates against the old set or the new one, never
// a mix, and a request already past authentication goes on as who it was.
// Serve calls it on SIGHUP with the tokens file read again. It refuses a
// nil t (that would be dev mode) and a server in dev mode (ErrDevMode).
func (s *Server) SetTokens(t *Tokens) error {
	if t == nil {
		return errors.New("server: SetTokens: no tokens (dev mode cannot be switched on)")
	}
	if s.tokens.Load() == nil {
		return ErrDevMode
	}
	s.tokens.Store(t)
	return nil
}

// lookupToken finds the identity of the request's bearer token. A
// missing, malformed or unknown token is 401, and spends one of the client
// address's allowance of 401s; an address that has none left is 429
// before its token is looked at (Config.RateLimit).
func (s *Server) lookupToken(r *http.Request, tokens *Tokens) (Identity, string, error) {
	addr := clientAddress(r.RemoteAddr)
	if s.authFailures != nil {
		if empty, retry := s.authFailures.empty(addr); empty {
			s.metrics.rateLimited.WithLabelValues("address").Inc()
			return Identity{}, "", rateLimited("address", retry)
		}
	}
	fail := func(detail string) (Identity, string, error) {
		if s.authFailures != nil {
			s.authFailures.spend(addr)
		}
		return Identity{}, "", &apiError{code: CodeUnauthorized, detail: detail}
	}
	tok, err := bearer(r)
	if err != nil {
		return fail(err.Error())
	}
	hash := HashToken(tok)
	id, ok := tokens.byHash[hash]
	if !ok {
		return fail("unknown token")
	}
	return id, hash, nil
}

// tokenInForce returns a check, for a request that goes on (an event
// stream, a long-poll), of whether the token it came with still stands
// for id: false once the tokens in force (SetTokens) lack it or give it
// another identity. Each call costs a pointer comparison until the tokens
// are swapped. In dev mode it always holds.
func (s *Server) tokenInForce(c echo.Context, id Identity) func() bool {
	hash, _ := c.Request().Context().Value(tokenHashKey{}).(string)
	seen, revoked := s.tokens.Load(), false
	return func() bool {
		cur := s.tokens.Load()
		if revoked || cur == seen {
			return !revoked // dev mode: nil, for good
		}
		seen = cur
		now, found := cur.byHash[hash]
		revoked = !found || !now.same(id)
		return !revoked
	}
}

// DevIdentity is who every request is in dev mode: with every role,
// admin included, it drives every agent.
func DevIdentity() Identity {
	return Identity{Principal: "dev", Tenant: "default", Roles: Roles()}
}

// loopback reports whether a RemoteAddr is a loopback address.
func loopback(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// needRole returns 403 unless the identity holds one of roles. It runs
// before any object is loaded, so it reveals nothing about ids.
func needRole(c echo.Context, roles ...Role) (Identity, error) {
	id, ok := identityFrom(c)
	if !ok {
		return Identity{}, &apiError{code: string(ledger.CodeInternal), detail: "no identity", err: errors.New("route without authentication")}
	}
	if !id.HasAny(roles...) {
		names := make([]string, len(roles))
		for i, r := range roles {
			names[i] = string(r)
		}
		return Identity{}, forbidden("this needs one of the roles %s", strings.Join(names, ", "))
	}
	return id, nil
}
