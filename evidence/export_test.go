package evidence

// ReportValue and ReportMarshal expose Report.value and Report.marshal to
// the tests of package evidence_test.
var (
	ReportValue   = (*Report).value
	ReportMarshal = (*Report).marshal
)
