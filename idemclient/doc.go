// Package idemclient is the client side of idem: an http.RoundTripper that
// makes unsafe requests (a card charge) safe to retry with an
// Idempotency-Key, as draft-ietf-httpapi-idempotency-key-header describes
// and as the idemhttp middleware expects.
//
//	client := &http.Client{Transport: &idemclient.Transport{}}
//	resp, err := client.Post(url, "application/json", strings.NewReader(body))
//
// For a request whose method is not safe in the sense of RFC 9110 (anything
// but GET, HEAD, OPTIONS and TRACE) and that has no Idempotency-Key field,
// [Transport] generates a random key and sends it as an sf-string:
//
//	Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
//
// A key the caller set is sent as it is. The key stays the same on every
// attempt, and so does the body, which is sent whole each time; each retry
// also carries its number, Idempotency-Attempt: 2 and so on
// ([HeaderAttempt]), so that the server can read the stored response
// before it claims the key (idem.WithRetryHint). [Transport]
// retries network errors (unless the request's context is done), 5xx
// answers other than 501, 409 (the key is in flight) and 429, with
// exponential backoff and full jitter, or after the time an answer's
// Retry-After asks for. It never retries any other status, and never a
// request that carries no key: a safe request without one (a plain GET)
// passes through untouched, sent once.
//
// Retries stop when the request's context is done, after
// [Transport].MaxAttempts attempts, or when the next one could not start
// within [Transport].MaxElapsed. When they stop for want of attempts or
// time, the last answer is returned as it is (a 409 or a 503, with its
// body), or the last network error.
//
// The key a request was sent with is in the header of the response's
// Request; Key reads it. To know a key before the request is sent, or to
// try a request again later, beyond one RoundTrip, generate it with [NewKey]
// and set it yourself.
//
// The package imports no database code: a client links none of idem's
// drivers.
package idemclient
