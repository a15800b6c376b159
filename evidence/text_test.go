package evidence_test

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/actionledger/ledger/evidence"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// TestTextDecodesToValue: for every string field and embedded document set
// to anything, the report's JSON text decodes to the value JSON validates;
// an embedded document that is not JSON is an error, not text.
func TestTextDecodesToValue(t *testing.T) {
	reports := testReports(t)
	t.Run("any text", func(t *testing.T) {
		base := reports["flipped"]
		rapid.Check(t, func(rt *rapid.T) {
			rep := *base
			rep.Timeline = append([]evidence.TimelineEvent(nil), base.Timeline[:3]...)
			rep.Actions = append([]evidence.Action(nil), base.Actions...)
			text := rapid.OneOf(rapid.String(), rapid.StringOf(rapid.RuneFrom([]rune{'"', '\\', '<', '>', '&', '\u2028', '\u2029', '\x00', '\x1f', '\x7f', '\b', '\f', '\n', '\r', '\t', 'é', '😀', 'a'})), rapid.Map(rapid.SliceOf(rapid.Byte()), func(b []byte) string { return string(b) }))
			setStrings(reflect.ValueOf(&rep).Elem(), func() string { return text.Draw(rt, "text") })
			doc := func(label string) json.RawMessage {
				b, err := json.Marshal(jsonDoc(3).Draw(rt, label))
				if err != nil {
					rt.Fatal(err)
				}
				if !rapid.Bool().Draw(rt, label+" indented") {
					return b
				}
				var ind bytes.Buffer
				if err := json.Indent(&ind, b, " ", "\t"); err != nil {
					rt.Fatal(err)
				}
				return append(ind.Bytes(), " \n"...)
			}
			rep.Timeline[1].Data = doc("data")
			rep.Actions[0].Arguments = doc("arguments")

			got, err := evidence.ReportMarshal(&rep)
			if err != nil {
				rt.Fatal(err)
			}
			d := json.NewDecoder(bytes.NewReader(got))
			d.UseNumber()
			var decoded any
			if err := d.Decode(&decoded); err != nil {
				rt.Fatal(err)
			}
			value, err := evidence.ReportValue(&rep)
			if err != nil {
				rt.Fatal(err)
			}
			if !reflect.DeepEqual(decoded, any(value)) {
				rt.Fatalf("the text decodes to\n%#v\nvalue is\n%#v", decoded, value)
			}
		})
	})
	t.Run("not JSON", func(t *testing.T) {
		rep := *reports["golden"]
		rep.Timeline = append([]evidence.TimelineEvent(nil), rep.Timeline...)
		for _, bad := range []string{"", "{", `{"a":1} {}`, "nope"} {
			rep.Timeline[0].Data = json.RawMessage(bad)
			_, err := evidence.ReportMarshal(&rep)
			require.Error(t, err, "%q", bad)
		}
	})
}

// setStrings sets every string of v (structs, slices, pointers to them)
// that is not a time to what next returns.
func setStrings(v reflect.Value, next func() string) {
	switch v.Kind() {
	case reflect.String:
		v.SetString(next())
	case reflect.Pointer:
		if !v.IsNil() {
			p := reflect.New(v.Type().Elem())
			p.Elem().Set(v.Elem())
			setStrings(p.Elem(), next)
			v.Set(p)
		}
	case reflect.Struct:
		if v.Type().PkgPath() == "time" {
			return
		}
		for i := range v.NumField() {
			setStrings(v.Field(i), next)
		}
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			return
		}
		c := reflect.MakeSlice(v.Type(), v.Len(), v.Len())
		reflect.Copy(c, v)
		for i := range c.Len() {
			setStrings(c.Index(i), next)
		}
		v.Set(c)
	}
}

// jsonDoc generates JSON values nested at most depth deep.
func jsonDoc(depth int) *rapid.Generator[any] {
	scalar := rapid.OneOf(
		rapid.Just[any](nil),
		rapid.Map(rapid.Bool(), func(b bool) any { return b }),
		rapid.Map(rapid.Int64(), func(n int64) any { return n }),
		rapid.Map(rapid.Float64Range(-1e300, 1e300), func(f float64) any { return f }),
		rapid.Map(rapid.String(), func(s string) any { return s }),
	)
	if depth == 0 {
		return scalar
	}
	inner := jsonDoc(depth - 1)
	return rapid.OneOf(
		scalar,
		rapid.Map(rapid.SliceOfN(inner, 0, 4), func(xs []any) any { return xs }),
		rapid.Map(rapid.MapOfN(rapid.String(), inner, 0, 4), func(m map[string]any) any { return m }),
	)
}
