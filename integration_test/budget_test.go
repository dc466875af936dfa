package integration_test

import (
	"context"
	"database/sql"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
)

// postgresConns is how many connections the suite's targets hold to the
// PostgreSQL server at once, all three direct targets together: the
// whole of make test fits in a stock server's 100 connections
// (DEVELOPERS.md counts the rest). It is more than a storm's 32
// transactions and the query that counts their rows, so that any one
// test runs whole in it; two targets running at once share it, and a
// target's dial waits until a connection of the other's closes.
const postgresConns = 36

// idleConns and idleTime bound what a target's pool keeps open between
// its bursts, so that the budget's connections go back to it: a storm's
// 32 connections close as they come back, but for idleConns, and those
// after idleTime unused.
const (
	idleConns = 4
	idleTime  = time.Second
)

// postgresBudget holds a token for every connection open to the
// PostgreSQL server through a budgeted dial.
var postgresBudget = make(chan struct{}, postgresConns)

// budgetDial dials as net.Dialer does once the budget has room, waiting
// for it until ctx ends; the connection gives its token back when it
// closes.
func budgetDial(ctx context.Context, network, addr string) (net.Conn, error) {
	select {
	case postgresBudget <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		<-postgresBudget
		return nil, err
	}
	return &budgetConn{Conn: c}, nil
}

// budgetConn is a connection that holds a token of postgresBudget.
type budgetConn struct {
	net.Conn
	once sync.Once
}

func (c *budgetConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { <-postgresBudget })
	return err
}

// pqDialer is lib/pq's dialer through budgetDial.
type pqDialer struct{}

func (pqDialer) Dial(network, addr string) (net.Conn, error) {
	return budgetDial(context.Background(), network, addr)
}

func (pqDialer) DialTimeout(network, addr string, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return budgetDial(ctx, network, addr)
}

func (pqDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return budgetDial(ctx, network, addr)
}

// openBudgeted opens a database/sql pool on dsn with the driver (lib/pq's
// "postgres" or pgx's "pgx") whose connections dial through budgetDial.
func openBudgeted(driver, dsn string) (*sql.DB, error) {
	if driver == "pgx" {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.DialFunc = budgetDial
		return stdlib.OpenDB(*cfg), nil
	}
	c, err := pq.NewConnector(dsn)
	if err != nil {
		return nil, err
	}
	c.Dialer(pqDialer{})
	return sql.OpenDB(c), nil
}
