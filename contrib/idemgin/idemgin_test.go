package idemgin_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/idemkit/idem/contrib/idemgin"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	testdb.Main(m, testdb.Postgres)
}

// payments is the payments service on gin: the charge handler behind
// idemgin.Middleware, binding its body with ShouldBindJSON and answering
// with c.JSON.
func payments(app *idemtest.PaymentsApp) http.Handler {
	r := gin.New()
	r.Use(gin.Recovery())
	r.POST("/v1/charges", idemgin.Middleware(app.Middleware), func(c *gin.Context) {
		var in idemtest.ChargeInput
		if err := c.ShouldBindJSON(&in); err != nil {
			c.JSON(http.StatusBadRequest, gin.H{"error": err.Error()})
			return
		}
		ctx := c.Request.Context()
		ref, err := app.Provider(ctx) // the slow call, before the transaction
		if err != nil {
			c.JSON(http.StatusBadGateway, gin.H{"error": err.Error()})
			return
		}
		charge, err := app.Record(ctx, idemhttp.TxFrom(ctx), in.Amount, ref)
		if err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
			return
		}
		c.Header("Location", "/v1/charges/"+charge.ID)
		c.JSON(http.StatusCreated, charge)
	})
	return r
}

func TestPayments(t *testing.T) { idemtest.RunHTTP(t, payments) }

// gin cannot run a chain twice: when the database aborts a request's
// commit and idemhttp would run its handler again, the request is rolled
// back and answered 503, and its retry runs.
func TestRerunAnswered503(t *testing.T) {
	if got := idemtest.RunHTTPRetry(t, payments); !slices.Equal(got, []int{201, 503}) {
		t.Fatalf("answers %v, want [201 503]", got)
	}
}

// The chain after the middleware (a middleware and the handler) runs
// inside it, on the handler's transaction, once per key: a retry replays
// the answer without running it, and the chain ahead of the middleware
// sees the answer that went out, and an aborted chain on a replay.
func TestChain(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemgin")
	var (
		mu    sync.Mutex
		outer []string
		inner atomic.Int64
	)
	r := gin.New()
	r.Use(gin.Recovery(), func(c *gin.Context) {
		c.Next()
		mu.Lock()
		defer mu.Unlock()
		outer = append(outer, fmt.Sprintf("%d %d aborted=%v", c.Writer.Status(), c.Writer.Size(), c.IsAborted()))
	})
	r.POST("/v1/orders", idemgin.Middleware(e.Middleware(t)), func(c *gin.Context) {
		inner.Add(1)
		c.Header("X-Inner", "ran")
		c.Next()
	}, func(c *gin.Context) {
		if err := e.Insert(c.Request.Context(), "order"); err != nil {
			c.JSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
			return
		}
		c.Header("Location", "/v1/orders/1")
		c.JSON(http.StatusCreated, gin.H{"id": 1})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	first := idemtest.Post(t, srv.URL+"/v1/orders", "chain-1")
	again := idemtest.Post(t, srv.URL+"/v1/orders", "chain-1")
	if first.Status != 201 || first.Body != `{"id":1}` || first.Replayed() || first.Header.Get("X-Inner") != "ran" {
		t.Fatalf("first: %d %q replayed=%v %v", first.Status, first.Body, first.Replayed(), first.Header)
	}
	if again.Status != 201 || again.Body != first.Body || !again.Replayed() || again.Header.Get("X-Inner") != "" ||
		again.Header.Get("Location") != "/v1/orders/1" || again.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("replay: %d %q replayed=%v %v", again.Status, again.Body, again.Replayed(), again.Header)
	}
	if n, runs := e.Rows(t, "chain-1"), inner.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d rows, the chain ran %d times; want 1 and 1", n, runs)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"201 8 aborted=false", "201 8 aborted=true"}; !slices.Equal(outer, want) {
		t.Fatalf("the middleware ahead saw %q, want %q", outer, want)
	}
}

// What the handler writes through gin is the answer: an abort's status
// and body (stored and replayed, and the rest of the chain skipped), a
// status without a body; an error in c.Errors with nothing written, a
// panic and a stream roll back and store nothing, so the retry runs again.
func TestAnswers(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemgin")
	var runs sync.Map // path -> *atomic.Int64
	count := func(c *gin.Context) {
		n, _ := runs.LoadOrStore(c.FullPath(), new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if err := e.Insert(c.Request.Context(), c.FullPath()); err != nil {
			c.AbortWithStatusJSON(http.StatusInternalServerError, gin.H{"error": err.Error()})
		}
	}
	ran := func(path string) int64 {
		n, ok := runs.Load(path)
		if !ok {
			return 0
		}
		return n.(*atomic.Int64).Load()
	}
	r := gin.New()
	r.Use(gin.Recovery())
	r.Use(idemgin.Middleware(e.Middleware(t)), count)
	r.POST("/forbidden", func(c *gin.Context) {
		c.AbortWithStatusJSON(http.StatusForbidden, gin.H{"error": "not yours"})
	}, func(c *gin.Context) {
		c.String(http.StatusOK, "after the abort")
	})
	r.POST("/accepted", func(c *gin.Context) { c.Status(http.StatusAccepted) })
	r.POST("/error", func(c *gin.Context) { _ = c.Error(errors.New("the card network is down")) })
	r.POST("/panic", func(c *gin.Context) { panic("the handler's bug") })
	r.POST("/stream", func(c *gin.Context) {
		c.Stream(func(w io.Writer) bool {
			fmt.Fprint(w, "part")
			return false
		})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()

	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/forbidden", `{"error":"not yours"}`, 403},
		{"/accepted", "", 202},
	} {
		for i := range 2 {
			a := idemtest.Post(t, srv.URL+c.path, "stored"+c.path)
			if a.Status != c.status || a.Body != c.body || a.Replayed() != (i == 1) {
				t.Errorf("%s, request %d: %d %q replayed=%v; want %d %q, then its replay", c.path, i+1, a.Status, a.Body, a.Replayed(), c.status, c.body)
			}
		}
		if n, runs := e.Rows(t, "stored"+c.path), ran(c.path); n != 1 || runs != 1 {
			t.Errorf("%s: %d rows, ran %d times; want 1 and 1", c.path, n, runs)
		}
	}

	for _, c := range []struct {
		path   string
		status int
		typ    string
	}{
		{"/error", 500, idemhttp.TypeInternal},
		{"/panic", 500, ""},
		{"/stream", 500, idemhttp.TypeStreaming},
	} {
		for i := range 2 {
			a := idemtest.Post(t, srv.URL+c.path, "failed"+c.path)
			if a.Status != c.status || a.Replayed() || !strings.Contains(a.Body, c.typ) {
				t.Errorf("%s, request %d: %d %q replayed=%v; want %d %s, never stored", c.path, i+1, a.Status, a.Body, a.Replayed(), c.status, c.typ)
			}
		}
		if n, runs := e.Rows(t, "failed"+c.path), ran(c.path); n != 0 || runs != 2 {
			t.Errorf("%s: %d rows, ran %d times; want 0 and 2", c.path, n, runs)
		}
	}
}

// A method the middleware does not handle runs the chain on gin's own
// writer, with no transaction: it may stream.
func TestPassThrough(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemgin")
	r := gin.New()
	r.GET("/v1/orders", idemgin.Middleware(e.Middleware(t)), func(c *gin.Context) {
		if idemhttp.TxFrom(c.Request.Context()) != nil {
			c.String(http.StatusInternalServerError, "a transaction for a GET")
			return
		}
		c.Stream(func(w io.Writer) bool {
			fmt.Fprint(w, "streamed")
			return false
		})
	})
	srv := httptest.NewServer(r)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/orders")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || string(b) != "streamed" {
		t.Fatalf("GET: %d %q %v; want 200 streamed", resp.StatusCode, b, err)
	}
}

// idemgin.TxFrom(c) is the transaction of the request's context, which
// idemhttp.TxFrom reads from c itself only when the engine sets
// ContextWithFallback; the row written through it commits with the key.
func TestTxFrom(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemgin")
	for _, fallback := range []bool{false, true} {
		r := gin.New()
		r.ContextWithFallback = fallback
		r.POST("/v1/orders", idemgin.Middleware(e.Middleware(t)), func(c *gin.Context) {
			tx := idemgin.TxFrom(c)
			switch {
			case tx == nil || tx != idemhttp.TxFrom(c.Request.Context()):
				c.String(http.StatusInternalServerError, "idemgin.TxFrom(c) is not the request's transaction")
				return
			case (idemhttp.TxFrom(c) != nil) != fallback:
				c.String(http.StatusInternalServerError, "idemhttp.TxFrom(c) with ContextWithFallback %v: %v", fallback, idemhttp.TxFrom(c))
				return
			}
			req, _ := idemhttp.RequestFrom(c.Request.Context())
			if _, err := tx.ExecContext(c.Request.Context(), "INSERT INTO "+e.Biz+" (k, v) VALUES ($1, 'order')", req.Key); err != nil {
				c.String(http.StatusInternalServerError, err.Error())
				return
			}
			c.Status(http.StatusCreated)
		})
		srv := httptest.NewServer(r)
		key := fmt.Sprintf("tx-from-%v", fallback)
		for i := range 2 {
			if a := idemtest.Post(t, srv.URL+"/v1/orders", key); a.Status != 201 || a.Replayed() != (i == 1) {
				t.Errorf("ContextWithFallback %v, request %d: %d %q replayed=%v; want 201, then its replay", fallback, i+1, a.Status, a.Body, a.Replayed())
			}
		}
		srv.Close()
		if n := e.Rows(t, key); n != 1 {
			t.Errorf("ContextWithFallback %v: %d rows, want 1", fallback, n)
		}
	}
}

// An error the chain records with c.Error, writing nothing, is answered
// as the middleware answers its own failures: a 500 problem that does not
// show it, the error logged to the middleware's Config.Logger.
func TestErrorLogged(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemgin")
	var log syncBuffer
	mw, err := idemhttp.New(idemhttp.Config{Store: e.Store, DB: e.DB, Scope: idemhttp.SingleTenant, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/v1/orders", idemgin.Middleware(mw), func(c *gin.Context) { _ = c.Error(errors.New("the card network is down")) })
	srv := httptest.NewServer(r)
	defer srv.Close()
	a := idemtest.Post(t, srv.URL+"/v1/orders", "logged")
	if a.Status != 500 || !strings.Contains(a.Body, idemhttp.TypeInternal) || strings.Contains(a.Body, "card network") {
		t.Fatalf("%d %q; want the middleware's 500 problem, without the error", a.Status, a.Body)
	}
	if got := log.String(); !strings.Contains(got, "the card network is down") {
		t.Fatalf("the middleware's log: %q; want the chain's error", got)
	}
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
