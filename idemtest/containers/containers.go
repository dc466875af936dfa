package containers

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the MySQL family's driver
	_ "github.com/jackc/pgx/v5/stdlib" // PostgreSQL's
	"github.com/ory/dockertest/v3"

	"github.com/idemkit/idem/idemtest/testdb"
)

// Docker is the testdb.Starter that starts a throwaway server from a
// Server's Image in a Docker container, and removes them all on Stop.
var Docker testdb.Starter = &docker{}

// Main is testdb.Main with Docker: it runs a package's tests, from its
// TestMain, and starts a container for each server they need that is
// neither set nor running, which it removes when they end.
func Main(m *testing.M, needs ...*testdb.Server) { os.Exit(Run(m, needs...)) }

// Run is Main that returns the exit code instead of exiting, for a
// TestMain with work of its own to do after the tests.
func Run(m *testing.M, needs ...*testdb.Server) int { return testdb.Run(m, Docker, needs...) }

// docker holds the daemon's client, opened by the first Start, and the
// containers started.
type docker struct {
	mu         sync.Mutex
	pool       *dockertest.Pool
	containers []*dockertest.Resource
}

// Start starts a throwaway server from s's image, for a machine with
// Docker and no server of its own, and returns its DSN.
func (d *docker) Start(s *testdb.Server) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool == nil {
		p, err := dockertest.NewPool("")
		if err != nil {
			return "", err
		}
		if err := p.Client.Ping(); err != nil {
			return "", fmt.Errorf("no Docker daemon answers: %w", err)
		}
		p.MaxWait = 2 * time.Minute
		d.pool = p
	}
	repo, tag, _ := strings.Cut(s.Image, ":")
	var (
		envs []string
		port string
		dsn  func(hostPort string) string
	)
	switch s.Driver {
	case "pgx":
		envs = []string{"POSTGRES_PASSWORD=idem", "POSTGRES_DB=test"}
		// The image's default of 100 connections, as a stock server's:
		// the suite fits in it (DEVELOPERS.md).
		port = "5432/tcp"
		dsn = func(hp string) string { return "postgres://postgres:idem@" + hp + "/test?sslmode=disable" }
	case "mysql":
		envs = []string{"MYSQL_ROOT_PASSWORD=idem", "MYSQL_DATABASE=test"}
		port = "3306/tcp"
		dsn = func(hp string) string { return "root:idem@tcp(" + hp + ")/test" }
	default:
		return "", errors.New("no container for " + s.Name)
	}
	res, err := d.pool.RunWithOptions(&dockertest.RunOptions{Repository: repo, Tag: tag, Env: envs})
	if err != nil {
		return "", err
	}
	d.containers = append(d.containers, res)
	_ = res.Expire(1800)
	url := dsn(res.GetHostPort(port))
	err = d.pool.Retry(func() error {
		db, err := sql.Open(s.Driver, url)
		if err != nil {
			return err
		}
		defer db.Close()
		return db.Ping()
	})
	return url, err
}

// Stop removes the containers Start started.
func (d *docker) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.containers {
		_ = d.pool.Purge(c)
	}
	d.containers = nil
}
