package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemserve"
)

// app is the payments service: charges in a table of db, made through a
// card provider, with idem guarding POST /v1/charges.
type app struct {
	db       *sql.DB
	dialect  idem.Dialect
	store    *idem.Store
	charges  string // the charges table
	provider CardProvider
	log      *slog.Logger
}

// handler creates the tables if they are absent and returns the routes.
func (a *app) handler(ctx context.Context) (http.Handler, error) {
	if err := a.store.Migrate(ctx, a.db); err != nil {
		return nil, err
	}
	if _, err := a.db.ExecContext(ctx, chargesDDL(a.dialect, a.charges)); err != nil {
		return nil, fmt.Errorf("create table %s: %w", a.charges, err)
	}
	mw, err := idemhttp.New(idemhttp.Config{
		Store:    a.store,
		DB:       a.db,
		Mode:     idemserve.ModeClaim,
		Required: true,
		Logger:   a.log,
		Scope:    account,
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", mw.Handler(http.HandlerFunc(a.createCharge)))
	mux.HandleFunc("GET /v1/charges/{id}", a.getCharge)
	return mux, nil
}

// account is the Scope of every key: the API client calling, named by
// its API key (Authorization: Bearer <key>), so that one client's key
// never replays another client's charge. This demo accepts any key; a real
// service looks it up and answers 401 for an unknown one. The scope is a
// digest of the key, so that no credential is stored in the idempotency
// table.
func account(r *http.Request) (string, error) {
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || key == "" {
		return "", &idemhttp.Problem{Type: "about:blank", Title: "Unauthorized", Status: http.StatusUnauthorized,
			Detail: "send your API key as Authorization: Bearer <key>"}
	}
	sum := sha256.Sum256([]byte(key))
	return "acct_" + hex.EncodeToString(sum[:8]), nil
}

func chargesDDL(d idem.Dialect, table string) string {
	switch d {
	case idem.MySQL, idem.MariaDB, idem.TiDB:
		return `CREATE TABLE IF NOT EXISTS ` + table + ` (
  id VARCHAR(40) PRIMARY KEY, amount BIGINT NOT NULL, currency VARCHAR(3) NOT NULL,
  status VARCHAR(10) NOT NULL, provider_ref VARCHAR(40) NOT NULL,
  created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))`
	case idem.SQLite:
		return `CREATE TABLE IF NOT EXISTS ` + table + ` (
  id TEXT PRIMARY KEY, amount INTEGER NOT NULL, currency TEXT NOT NULL,
  status TEXT NOT NULL, provider_ref TEXT NOT NULL,
  created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ')))`
	}
	return `CREATE TABLE IF NOT EXISTS ` + table + ` (
  id text PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL,
  status text NOT NULL, provider_ref text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now())`
}

// chargeJSON is a charge as the API shows it.
type chargeJSON struct {
	ID          string `json:"id"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Status      string `json:"status"` // "succeeded" or "declined"
	ProviderRef string `json:"provider_ref"`
}

// createCharge charges a card and records the charge. It runs under a
// claim on the client's Idempotency-Key (idemserve.ModeClaim): no
// transaction is open during the provider call, and duplicates that arrive
// meanwhile get a 409 with Retry-After. The provider is called with the
// claim's RelayKey, so even a rerun of this handler (after a 502, or after
// a takeover of a claim whose lease ran out) charges the card once. The
// request's context is the middleware's: a client that gives up does not
// cancel the provider call, which is bounded by the claim's lease instead,
// so the charge is recorded and the client's retry replays it. The charge
// row is written through idemhttp.TxFrom, where the middleware also
// completes the claim: both commit together.
func (a *app) createCharge(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
		Card     string `json:"card"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		problem(w, http.StatusBadRequest, "invalid body: "+err.Error())
		return
	}
	if in.Amount <= 0 || len(in.Currency) != 3 || in.Card == "" {
		problem(w, http.StatusBadRequest, `want {"amount": a positive integer in minor units, "currency": a 3-letter code, "card": a card number}`)
		return
	}
	claim := idemhttp.ClaimFrom(r.Context())
	res, err := a.provider.Charge(r.Context(), claim.RelayKey(), Charge{Amount: in.Amount, Currency: in.Currency, Card: in.Card})
	if err != nil {
		a.log.WarnContext(r.Context(), "provider call failed", "err", err)
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusBadGateway, "the card provider failed; nothing was charged or stored; retry with the same Idempotency-Key")
		return
	}
	c := chargeJSON{ID: "ch_" + rand.Text()[:20], Amount: in.Amount, Currency: strings.ToLower(in.Currency), Status: "succeeded", ProviderRef: res.Ref}
	status := http.StatusCreated
	if res.Declined {
		c.Status, status = "declined", http.StatusPaymentRequired
	}
	tx := idemhttp.TxFrom(r.Context()) // begins the transaction, now that the slow part is done
	if tx == nil {
		problem(w, http.StatusServiceUnavailable, "the database is unavailable; retry with the same Idempotency-Key")
		return
	}
	_, err = tx.ExecContext(r.Context(), a.rebind(
		`INSERT INTO `+a.charges+` (id, amount, currency, status, provider_ref) VALUES (?, ?, ?, ?, ?)`),
		c.ID, c.Amount, c.Currency, c.Status, c.ProviderRef)
	if err != nil {
		a.log.ErrorContext(r.Context(), "insert charge", "err", err)
		problem(w, http.StatusInternalServerError, "the charge could not be recorded; retry with the same Idempotency-Key")
		return
	}
	w.Header().Set("Location", "/v1/charges/"+c.ID)
	writeJSON(w, status, c)
}

func (a *app) getCharge(w http.ResponseWriter, r *http.Request) {
	var c chargeJSON
	err := a.db.QueryRowContext(r.Context(), a.rebind(
		`SELECT id, amount, currency, status, provider_ref FROM `+a.charges+` WHERE id = ?`), r.PathValue("id")).
		Scan(&c.ID, &c.Amount, &c.Currency, &c.Status, &c.ProviderRef)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		problem(w, http.StatusNotFound, "no charge with this id")
	case err != nil:
		a.log.ErrorContext(r.Context(), "read charge", "err", err)
		problem(w, http.StatusInternalServerError, "the charge could not be read")
	default:
		writeJSON(w, http.StatusOK, c)
	}
}

// rebind turns ? placeholders into $1, $2, ... for Postgres.
func (a *app) rebind(q string) string {
	if a.dialect != idem.Postgres {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// problem answers with an RFC 9457 problem of type about:blank.
func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail,
	})
}
