package idemecho_test

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

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idem/contrib/idemecho"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/idemtest/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m, testdb.Postgres) }

// payments is the payments service on echo: the charge handler behind
// idemecho.Middleware, binding its body with c.Bind and answering with
// c.JSON, or with an error the way echo handlers do.
func payments(app *idemtest.PaymentsApp) http.Handler {
	e := echo.New()
	e.Use(middleware.Recover())
	e.POST("/v1/charges", func(c echo.Context) error {
		var in idemtest.ChargeInput
		if err := c.Bind(&in); err != nil {
			return err // echo's 400, stored and replayed
		}
		ctx := c.Request().Context()
		ref, err := app.Provider(ctx) // the slow call, before the transaction
		if err != nil {
			return echo.NewHTTPError(http.StatusBadGateway, err.Error())
		}
		charge, err := app.Record(ctx, idemhttp.TxFrom(ctx), in.Amount, ref)
		if err != nil {
			return err // echo's 500: rolled back
		}
		c.Response().Header().Set("Location", "/v1/charges/"+charge.ID)
		return c.JSON(http.StatusCreated, charge)
	}, idemecho.Middleware(app.Middleware))
	return e
}

func TestPayments(t *testing.T) { idemtest.RunHTTP(t, payments) }

// When the database aborts a request's commit, idemhttp runs the chain
// again, and both charges get their 201.
func TestRerun(t *testing.T) {
	if got := idemtest.RunHTTPRetry(t, payments); !slices.Equal(got, []int{201, 201}) {
		t.Fatalf("answers %v, want [201 201]", got)
	}
}

// The chain after the middleware (a middleware and the handler) runs
// inside it, on the handler's transaction, once per key: a retry replays
// the answer without running it, and the middleware ahead sees the
// answer that went out, and no error.
func TestChain(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemecho")
	var (
		mu    sync.Mutex
		outer []string
		inner atomic.Int64
	)
	ec := echo.New()
	ec.Use(middleware.Recover(), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			mu.Lock()
			defer mu.Unlock()
			outer = append(outer, fmt.Sprintf("%d %d committed=%v err=%v", c.Response().Status, c.Response().Size, c.Response().Committed, err))
			return err
		}
	})
	ec.POST("/v1/orders", func(c echo.Context) error {
		if err := e.Insert(c.Request().Context(), "order"); err != nil {
			return err
		}
		c.Response().Header().Set("Location", "/v1/orders/1")
		return c.JSON(http.StatusCreated, map[string]int{"id": 1})
	}, idemecho.Middleware(e.Middleware(t)), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			inner.Add(1)
			c.Response().Header().Set("X-Inner", "ran")
			return next(c)
		}
	})
	srv := httptest.NewServer(ec)
	defer srv.Close()

	first := idemtest.Post(t, srv.URL+"/v1/orders", "chain-1")
	again := idemtest.Post(t, srv.URL+"/v1/orders", "chain-1")
	if first.Status != 201 || first.Body != `{"id":1}` || first.Replayed() || first.Header.Get("X-Inner") != "ran" {
		t.Fatalf("first: %d %q replayed=%v %v", first.Status, first.Body, first.Replayed(), first.Header)
	}
	if again.Status != 201 || again.Body != first.Body || !again.Replayed() || again.Header.Get("X-Inner") != "" ||
		again.Header.Get("Location") != "/v1/orders/1" || again.Header.Get("Content-Type") != echo.MIMEApplicationJSON {
		t.Fatalf("replay: %d %q replayed=%v %v", again.Status, again.Body, again.Replayed(), again.Header)
	}
	if n, runs := e.Rows(t, "chain-1"), inner.Load(); n != 1 || runs != 1 {
		t.Fatalf("%d rows, the chain ran %d times; want 1 and 1", n, runs)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"201 9 committed=true err=<nil>", "201 9 committed=true err=<nil>"}; !slices.Equal(outer, want) {
		t.Fatalf("the middleware ahead saw %q, want %q", outer, want)
	}
}

// What the handler answers through echo is the answer: an echo.HTTPError
// of 4xx and a status without a body are stored and replayed; another
// error, an error the error handler answers nothing for, a panic and a
// flush roll back and store nothing, so the retry runs again.
func TestAnswers(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemecho")
	var runs sync.Map // path -> *atomic.Int64
	ran := func(path string) int64 {
		n, ok := runs.Load(path)
		if !ok {
			return 0
		}
		return n.(*atomic.Int64).Load()
	}
	ec := echo.New()
	ec.Logger.SetOutput(io.Discard) // the panic's stack
	ec.Use(middleware.Recover(), idemecho.Middleware(e.Middleware(t)), func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			n, _ := runs.LoadOrStore(c.Path(), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			if err := e.Insert(c.Request().Context(), c.Path()); err != nil {
				return err
			}
			return next(c)
		}
	})
	ec.POST("/forbidden", func(echo.Context) error { return echo.NewHTTPError(http.StatusForbidden, "not yours") })
	ec.POST("/accepted", func(c echo.Context) error { return c.NoContent(http.StatusAccepted) })
	ec.POST("/error", func(echo.Context) error { return errors.New("the card network is down") })
	ec.POST("/panic", func(echo.Context) error { panic("the handler's bug") })
	ec.POST("/flush", func(c echo.Context) error {
		fmt.Fprint(c.Response(), "part")
		c.Response().Flush()
		return nil
	})
	quiet := echo.New()
	quiet.HTTPErrorHandler = func(error, echo.Context) {} // logs, answers nothing
	quiet.Use(idemecho.Middleware(e.Middleware(t)))
	quiet.POST("/quiet", func(c echo.Context) error {
		if err := e.Insert(c.Request().Context(), "quiet"); err != nil {
			return err
		}
		return errors.New("answered by nobody")
	})
	srv, quietSrv := httptest.NewServer(ec), httptest.NewServer(quiet)
	defer srv.Close()
	defer quietSrv.Close()

	for _, c := range []struct {
		path, body string
		status     int
	}{
		{"/forbidden", `{"message":"not yours"}`, 403},
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
		url, path string
		body      string
	}{
		{srv.URL, "/error", `{"message":"Internal Server Error"}`},
		{srv.URL, "/panic", `{"message":"Internal Server Error"}`},
		{srv.URL, "/flush", idemhttp.TypeStreaming},
		{quietSrv.URL, "/quiet", idemhttp.TypeInternal},
	} {
		for i := range 2 {
			a := idemtest.Post(t, c.url+c.path, "failed"+c.path)
			if a.Status != 500 || a.Replayed() || !strings.Contains(a.Body, c.body) {
				t.Errorf("%s, request %d: %d %q replayed=%v; want a 500 with %s, never stored", c.path, i+1, a.Status, a.Body, a.Replayed(), c.body)
			}
		}
		if n := e.Rows(t, "failed"+c.path); n != 0 {
			t.Errorf("%s: %d rows; want 0", c.path, n)
		}
	}
	for _, path := range []string{"/error", "/panic", "/flush"} {
		if n := ran(path); n != 2 {
			t.Errorf("%s ran %d times, want 2: once per request", path, n)
		}
	}
}

// A method the middleware does not handle runs the chain as echo would
// without it: no transaction, and its error goes back to echo.
func TestPassThrough(t *testing.T) {
	e := idemtest.NewRouterEnv(t, "idemecho")
	gotc := make(chan error, 1)
	ec := echo.New()
	ec.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			gotc <- err
			return err
		}
	}, idemecho.Middleware(e.Middleware(t)))
	ec.GET("/v1/orders/:id", func(c echo.Context) error {
		if idemhttp.TxFrom(c.Request().Context()) != nil {
			return errors.New("a transaction for a GET")
		}
		return echo.NewHTTPError(http.StatusNotFound, "no order "+c.Param("id"))
	})
	srv := httptest.NewServer(ec)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/v1/orders/7")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 404 || strings.TrimSpace(string(b)) != `{"message":"no order 7"}` {
		t.Fatalf("GET: %d %q %v; want echo's 404", resp.StatusCode, b, err)
	}
	var he *echo.HTTPError
	if got := <-gotc; !errors.As(got, &he) || he.Code != 404 {
		t.Fatalf("the middleware ahead got %v, want the handler's 404", got)
	}
}
