// Package servertest holds the test support of the HTTP API: a Validator
// that checks every answer a test receives against the OpenAPI document the
// server serves (GET /v1/openapi.json), with kin-openapi's openapi3filter,
// and an httptest server that passes each answer through it. The API
// document is the truth: an answer it does not describe fails the test.
//
// Where the document refers to a component that a published contract
// describes too (an Action, contracts action.v1), the value in the answer is
// checked against the contract as well.
//
// It is imported only by tests (internal/archtest holds that), of package
// server and of cmd/ledger. Of ours it imports only contracts: it reads
// the server only over HTTP, as a client would. It is the one package that
// imports kin-openapi.
package servertest
