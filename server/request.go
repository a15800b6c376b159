package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/actionledger/ledger/ledger"
)

// readBody reads a request body in the order the API documents: the media type
// (415), the size (413), then the JSON itself (400 invalid_json: malformed,
// a duplicate key, nesting deeper than ledger.MaxJSONDepth). With
// allowEmpty, an absent or empty body returns nil whatever its
// Content-Type.
func (s *Server) readBody(c echo.Context, allowEmpty bool) ([]byte, error) {
	r := c.Request()
	if allowEmpty && r.ContentLength == 0 {
		return nil, nil
	}
	if r.ContentLength > s.maxBody {
		return nil, problemf(CodePayloadTooLarge, "the body is larger than %d bytes", s.maxBody)
	}
	mediaOK := jsonMediaType(r.Header.Get(echo.HeaderContentType))
	// A body of unknown length that may be empty is read before its media
	// type is judged; any other is refused before it is read.
	if !mediaOK && !(allowEmpty && r.ContentLength < 0) {
		return nil, problemf(CodeUnsupportedMediaType, "the body must be application/json")
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.maxBody))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, problemf(CodePayloadTooLarge, "the body is larger than %d bytes", s.maxBody)
	case err != nil:
		return nil, &apiError{code: string(ledger.CodeInvalid), detail: "could not read the body", err: err}
	}
	if allowEmpty && len(body) == 0 {
		return nil, nil
	}
	if !mediaOK {
		return nil, problemf(CodeUnsupportedMediaType, "the body must be application/json")
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, problemf(CodeInvalidJSON, "the body is empty")
	}
	if err := ledger.CheckJSON(body); err != nil {
		return nil, problemf(CodeInvalidJSON, "%s", err.Error())
	}
	return body, nil
}

// jsonMediaType accepts application/json with, at most, a UTF-8 charset.
func jsonMediaType(ct string) bool {
	if ct == "" {
		return false
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}

// decodeStrict decodes a body that passed readBody into out, a pointer to
// a struct, refusing unknown fields and wrong types as schema violations
// located at the field, and then checking that every field named in
// required is present.
func decodeStrict(body []byte, out any, required ...string) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return schemaError(err)
	}
	if len(required) > 0 {
		var present map[string]json.RawMessage
		if err := json.Unmarshal(body, &present); err != nil {
			return schemaError(err)
		}
		var missing []FieldError
		for _, f := range required {
			if _, ok := present[f]; !ok {
				missing = append(missing, FieldError{Location: "/" + f, Message: "required field is missing"})
			}
		}
		if len(missing) > 0 {
			return &apiError{code: CodeSchemaViolation, detail: "the body does not match its schema", fields: missing}
		}
	}
	return nil
}

// schemaError turns a decoding error into a schema violation at the field
// it is about.
func schemaError(err error) error {
	var te *json.UnmarshalTypeError
	fe := FieldError{Message: err.Error()}
	switch {
	case errors.As(err, &te):
		fe.Location = pointer(te.Field)
		fe.Message = "expected " + jsonKind(te.Type) + ", got " + te.Value
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, uerr := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		if uerr == nil {
			fe.Location, fe.Message = "/"+escapePointer(name), "unknown field"
		}
	}
	return &apiError{code: CodeSchemaViolation, detail: "the body does not match its schema", fields: []FieldError{fe}}
}

// pointer turns encoding/json's dotted field path into a JSON pointer.
func pointer(field string) string {
	if field == "" {
		return ""
	}
	parts := strings.Split(field, ".")
	for i, p := range parts {
		parts[i] = escapePointer(p)
	}
	return "/" + strings.Join(parts, "/")
}

func escapePointer(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Struct, reflect.Map:
		return "object"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	default:
		return t.String()
	}
}

// writeJSON sends v as JSON with the given content type. Encoding is
// deterministic (struct fields in order, map keys sorted), so the same
// value always gives the same bytes. HTML characters are not escaped:
// arguments come out as recorded, and nosniff keeps browsers from reading
// JSON as HTML.
func writeJSON(c echo.Context, status int, contentType string, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode response: %w", err)
	}
	c.Response().Header().Set("X-Content-Type-Options", "nosniff")
	return c.Blob(status, contentType, buf.Bytes())
}

// sendJSON sends v as application/json.
func sendJSON(c echo.Context, status int, v any) error {
	return writeJSON(c, status, echo.MIMEApplicationJSON, v)
}
