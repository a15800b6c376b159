package main

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/actionledger/ledger/server"
	"github.com/spf13/cobra"
)

// submitOptions are the flags of ledger submit.
type submitOptions struct {
	client       clientOptions
	field        string
	agent        string
	inputPath    string
	title        string
	markdownPath string
	key          string
	budgets      server.SubmitBudgets
	maxExecution time.Duration
	deadline     time.Duration
}

func newSubmitCmd() *cobra.Command {
	var o submitOptions
	cmd := &cobra.Command{
		Use:   "submit --agent NAME (--input FILE|- | --title T --markdown-file F) [--key K]",
		Short: "Submit a run to the server (POST /v1/runs)",
		Long: `Submit a run of an agent registered in the server. The agent's input is a JSON
object read from --input (a file, or - for stdin), or, for practice-cards, built from
--title and the Markdown in --markdown-file.

Every submit carries an Idempotency-Key: --key, or a fresh random one that is printed
so the same submit can be replayed safely with --key. A replay of the same key and body
answers with the first run again ("replayed: true"); the same key with another body is
refused (exit status 6).

With --json the server's answer is printed as JSON on stdout, and the key and replay
flag go to stderr; --field prints one field of it instead (--field id: the run id
alone, for a shell to capture).`,
		Args: usageArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runSubmit(cmd, &o) },
		Example: `  ledger submit --title "Rust ownership" --markdown-file notes.md
  ledger submit --input input.json --key nightly-2025-01-31
  RUN=$(ledger submit --title T --markdown-file notes.md --field id)`,
	}
	f := cmd.Flags()
	f.StringVar(&o.agent, "agent", "practice-cards", "agent to run")
	f.StringVar(&o.inputPath, "input", "", "file holding the agent's input as a JSON object, or - for stdin")
	f.StringVar(&o.title, "title", "", "practice-cards: title of the document")
	f.StringVar(&o.markdownPath, "markdown-file", "", "practice-cards: Markdown file to make cards from")
	f.StringVar(&o.key, "key", "", "idempotency key (1-255 printable ASCII); default a fresh random one")
	f.Int64Var(&o.budgets.MaxSteps, "budget-max-steps", 0, "budget: model steps (0: server default)")
	f.Int64Var(&o.budgets.MaxTokens, "budget-max-tokens", 0, "budget: model tokens (0: server default)")
	f.Int64Var(&o.budgets.MaxAttemptsPerAction, "budget-max-attempts-per-action", 0, "budget: attempts of one action (0: server default)")
	f.Int64Var(&o.budgets.MaxAttemptsPerRun, "budget-max-attempts-per-run", 0, "budget: attempts across the run (0: server default)")
	f.DurationVar(&o.maxExecution, "budget-max-execution", 0, "budget: execution time of the run, e.g. 5m (0: server default)")
	f.DurationVar(&o.deadline, "budget-deadline", 0, "budget: wall-clock deadline after submit, e.g. 1h (0: server default)")
	addClientFlags(cmd, &o.client)
	addFieldFlag(cmd, &o.field)
	return asUsage(cmd)
}

func runSubmit(cmd *cobra.Command, o *submitOptions) error {
	if err := checkOutputFlags(o.client, o.field); err != nil {
		return err
	}
	body, err := o.request(cmd.InOrStdin())
	if err != nil {
		return err
	}
	key := o.key
	generated := key == ""
	if generated {
		key = newIdempotencyKey()
	}
	c, err := o.client.newClient()
	if err != nil {
		return err
	}
	res, err := c.do(cmd.Context(), request{
		method: http.MethodPost, path: "/v1/runs", body: body,
		header: http.Header{"Idempotency-Key": {key}},
	})
	if err != nil {
		if generated {
			// The server may have accepted it before the answer was lost:
			// the key is what lets the user find out without a second run.
			fmt.Fprintf(cmd.ErrOrStderr(), "idempotency key: %s (retry with --key %s)\n", key, key)
		}
		return err
	}
	var sr server.SubmitResponse
	if err := decodeBody(res.body, &sr); err != nil {
		return fmt.Errorf("POST /v1/runs: %w", err)
	}
	replayed := strings.EqualFold(res.header.Get("Idempotent-Replayed"), "true")
	out := cmd.OutOrStdout()
	switch {
	case o.client.asJSON:
		fmt.Fprintf(cmd.ErrOrStderr(), "idempotency key: %s\nreplayed: %t\n", key, replayed)
		return printJSON(out, res.body)
	case o.field != "":
		fmt.Fprintf(cmd.ErrOrStderr(), "idempotency key: %s\nreplayed: %t\n", key, replayed)
		return printField(out, res.body, "", o.field)
	}
	fmt.Fprintf(out, "run:             %s\n", sr.ID)
	fmt.Fprintf(out, "state:           %s\n", sr.State)
	fmt.Fprintf(out, "agent:           %s\n", sr.Agent)
	fmt.Fprintf(out, "tenant:          %s\n", sr.Tenant)
	fmt.Fprintf(out, "request digest:  %s\n", sr.RequestDigest)
	fmt.Fprintf(out, "idempotency key: %s\n", key)
	if replayed {
		fmt.Fprintln(out, "replayed:        true (this key was submitted before; this is that run)")
	}
	if generated {
		fmt.Fprintf(out, "\nTo resubmit safely, repeat the command with --key %s\n", key)
	}
	return nil
}

// request builds the submit body from the flags.
func (o *submitOptions) request(stdin io.Reader) (*server.SubmitRequest, error) {
	if o.agent == "" {
		return nil, usagef("--agent is required")
	}
	var input json.RawMessage
	switch {
	case o.inputPath != "" && (o.title != "" || o.markdownPath != ""):
		return nil, usagef("give either --input or --title with --markdown-file, not both")
	case o.inputPath != "":
		data, err := readInput(o.inputPath, stdin)
		if err != nil {
			return nil, err
		}
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(data, &obj); err != nil {
			return nil, usagef("--input %s: want a JSON object: %v", o.inputPath, err)
		}
		input = json.RawMessage(data)
	case o.title != "" || o.markdownPath != "":
		if o.title == "" || o.markdownPath == "" {
			return nil, usagef("--title and --markdown-file go together")
		}
		md, err := os.ReadFile(o.markdownPath)
		if err != nil {
			return nil, usagef("--markdown-file: %w", err)
		}
		b, err := json.Marshal(map[string]string{"title": o.title, "markdown": string(md)})
		if err != nil {
			return nil, err
		}
		input = b
	default:
		return nil, usagef("give the input: --input FILE|- or --title T --markdown-file F")
	}
	req := &server.SubmitRequest{Agent: o.agent, Input: input}
	b := o.budgets
	b.MaxExecutionMS = o.maxExecution.Milliseconds()
	b.DeadlineMS = o.deadline.Milliseconds()
	for _, c := range []struct {
		flag string
		v    int64
	}{{"budget-max-steps", b.MaxSteps}, {"budget-max-tokens", b.MaxTokens},
		{"budget-max-attempts-per-action", b.MaxAttemptsPerAction}, {"budget-max-attempts-per-run", b.MaxAttemptsPerRun},
		{"budget-max-execution", b.MaxExecutionMS}, {"budget-deadline", b.DeadlineMS}} {
		if c.v < 0 {
			return nil, usagef("--%s must not be negative", c.flag)
		}
	}
	if b != (server.SubmitBudgets{}) {
		req.Budgets = &b
	}
	return req, nil
}

// readInput reads path, or stdin for "-".
func readInput(path string, stdin io.Reader) ([]byte, error) {
	if path == "-" {
		data, err := io.ReadAll(stdin)
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		return data, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("--input: %w", err)
	}
	return data, nil
}

// newIdempotencyKey returns a fresh random key: "cli-" and 26 characters
// of crypto/rand text, well inside the 1–255 printable ASCII the server
// accepts.
func newIdempotencyKey() string { return "cli-" + rand.Text() }
