// Package archtest holds no code: its test checks that the project's
// packages import each other only in the direction ARCHITECTURE.md sets,
// and that GORM and Echo stay inside the one package each that owns them.
package archtest
