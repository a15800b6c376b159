package contracts

import (
	"errors"
	"fmt"
	"strings"
)

// ErrInvalid is matched (errors.Is) by every error about a document that
// breaks its schema. The error is a *ValidationError; use errors.As to list
// the problems.
var ErrInvalid = errors.New("contracts: invalid document")

// ErrUnsupportedVersion is matched (errors.Is) by errors about a document
// whose schema_version has a major version this build does not read. The
// error is a *VersionError.
var ErrUnsupportedVersion = errors.New("contracts: unsupported schema version")

// Issue is one problem found in a document.
type Issue struct {
	// Location is a JSON Pointer (RFC 6901) into the document; "" is the
	// document itself. For a missing or unknown field it points at the field.
	Location string `json:"location"`
	// Message says what is wrong, in a few words.
	Message string `json:"message"`
}

// ValidationError reports every problem that made a document fail its
// schema. It matches ErrInvalid.
type ValidationError struct {
	// Subject names what was validated: a Schema name, or the arguments of a
	// tool.
	Subject string
	// Issues are sorted by Location, then Message. There is at least one.
	Issues []Issue
}

// Error lists the issues on one line.
func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "contracts: invalid %s: ", e.Subject)
	for i, is := range e.Issues {
		if i > 0 {
			b.WriteString("; ")
		}
		loc := is.Location
		if loc == "" {
			loc = "(document)"
		}
		fmt.Fprintf(&b, "%s: %s", loc, is.Message)
	}
	return b.String()
}

// Unwrap returns ErrInvalid.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

// VersionError reports a schema_version whose major version this build does
// not read. It matches ErrUnsupportedVersion.
type VersionError struct {
	// Schema is the schema the document was checked against.
	Schema Schema
	// Version is the schema_version found in the document.
	Version string
}

// Error names the schema, the version found and the version supported.
func (e *VersionError) Error() string {
	return fmt.Sprintf("contracts: %s schema_version %q is not supported (this build reads major version %d)",
		e.Schema, e.Version, SupportedMajor)
}

// Unwrap returns ErrUnsupportedVersion.
func (e *VersionError) Unwrap() error { return ErrUnsupportedVersion }
