package sqlrows

import (
	"encoding/json"
	"time"
)

// Micros is t as the columns store it: unix microseconds.
func Micros(t time.Time) int64 { return t.UnixMicro() }

// FromMicros is the time of a column's unix microseconds, in UTC.
func FromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

// MicrosPtr is Micros of a nullable time; nil is NULL.
func MicrosPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	us := Micros(*t)
	return &us
}

// TimePtr is FromMicros of a nullable column; NULL is nil.
func TimePtr(us *int64) *time.Time {
	if us == nil {
		return nil
	}
	t := FromMicros(*us)
	return &t
}

// StrPtr is s for a nullable column: "" is NULL.
func StrPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Deref is a nullable column's text: NULL is "".
func Deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// RawPtr is JSON for a nullable column: none is NULL.
func RawPtr(r json.RawMessage) *string {
	if len(r) == 0 {
		return nil
	}
	s := string(r)
	return &s
}

// PtrRaw is a nullable column's JSON: NULL is none.
func PtrRaw(s *string) json.RawMessage {
	if s == nil {
		return nil
	}
	return json.RawMessage(*s)
}
