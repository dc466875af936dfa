package idemgin_test

import (
	"errors"
	"fmt"
	"io"
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
	"github.com/idemkit/idem/internal/stacktest"
	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) {
	gin.SetMode(gin.TestMode)
	testdb.Main(m, testdb.Postgres)
}

// payments is the payments service on gin: the charge handler behind
// idemgin.Middleware, binding its body with ShouldBindJSON and answering
// with c.JSON.
func payments(app *stacktest.HTTPApp) http.Handler {
	r := gin.New()
	r.Use(gin.Recovery())
	r.POST("/v1/charges", idemgin.Middleware(app.Middleware), func(c *gin.Context) {
		var in stacktest.HTTPChargeRequest
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

func TestPayments(t *testing.T) { stacktest.RunHTTP(t, payments) }

// gin cannot run a chain twice: when the database aborts a request's
// commit and idemhttp would run its handler again, the request is rolled
// back and answered 503, and its retry runs.
func TestRerunAnswered503(t *testing.T) {
	if got := stacktest.RunHTTPRetry(t, payments); !slices.Equal(got, []int{201, 503}) {
		t.Fatalf("answers %v, want [201 503]", got)
	}
}

// The chain after the middleware (a middleware and the handler) runs
// inside it, on the handler's transaction, once per key: a retry replays
// the answer without running it, and the chain ahead of the middleware
// sees the answer that went out, and an aborted chain on a replay.
func TestChain(t *testing.T) {
	e := stacktest.NewHTTPEnv(t, "idemgin")
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

	first := stacktest.Post(t, srv.URL+"/v1/orders", "chain-1")
	again := stacktest.Post(t, srv.URL+"/v1/orders", "chain-1")
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
	e := stacktest.NewHTTPEnv(t, "idemgin")
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
			a := stacktest.Post(t, srv.URL+c.path, "stored"+c.path)
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
			a := stacktest.Post(t, srv.URL+c.path, "failed"+c.path)
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
	e := stacktest.NewHTTPEnv(t, "idemgin")
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
