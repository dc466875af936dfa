package idemhttp

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// The problem types the middleware answers with. Each is the address of
// its section in docs/http.md, which says what it means and what to do.
const (
	TypeMissingKey   = docs + "#missing-key"
	TypeInvalidKey   = docs + "#invalid-key"
	TypeBodyTooLarge = docs + "#body-too-large"
	TypeBodyUnread   = docs + "#body-unread"
	TypeKeyReused    = docs + "#key-reused"
	TypeInFlight     = docs + "#in-flight"
	TypeContention   = docs + "#contention"
	TypeStreaming    = docs + "#streaming-not-supported"
	TypeInternal     = docs + "#internal"
)

const docs = "https://github.com/idemkit/idem/blob/main/docs/http.md"

// Problem is an RFC 9457 problem details object, written as
// application/problem+json. Every answer of the middleware itself is a
// Problem. A Scope function may return one (say a 401) to answer with it;
// any other error from Scope is a 500.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// RetryAfter, when positive, is sent as a Retry-After header in whole
	// seconds, rounded up.
	RetryAfter time.Duration `json:"-"`
}

// Error returns the title and the detail.
func (p *Problem) Error() string {
	return fmt.Sprintf("idemhttp: %d %s: %s", p.Status, p.Title, p.Detail)
}

// ServeHTTP writes the problem: its status, Content-Type
// application/problem+json, Cache-Control no-store, Retry-After when set,
// and the JSON body.
func (p *Problem) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	body, err := json.Marshal(p)
	if err != nil { // a struct of strings and an int always marshals
		panic(err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		secs := (p.RetryAfter + time.Second - 1) / time.Second
		h.Set("Retry-After", strconv.FormatInt(int64(secs), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

func problem(status int, typ, title, detail string, args ...any) *Problem {
	return &Problem{Type: typ, Title: title, Status: status, Detail: fmt.Sprintf(detail, args...)}
}
