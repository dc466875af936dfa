package testdb

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ory/dockertest/v3"
)

var (
	dockerMu   sync.Mutex
	containers []*dockertest.Resource
	docker     *dockertest.Pool
)

// startContainer starts a throwaway server from s's image, for a machine
// with Docker and no server of its own, and returns its DSN.
func startContainer(s *Server) (string, error) {
	dockerMu.Lock()
	defer dockerMu.Unlock()
	if docker == nil {
		p, err := dockertest.NewPool("")
		if err != nil {
			return "", err
		}
		if err := p.Client.Ping(); err != nil {
			return "", fmt.Errorf("no Docker daemon answers: %w", err)
		}
		p.MaxWait = 2 * time.Minute
		docker = p
	}
	repo, tag, _ := strings.Cut(s.Image, ":")
	var (
		envs []string
		cmd  []string
		port string
		dsn  func(hostPort string) string
	)
	switch s.Driver {
	case "pgx":
		envs = []string{"POSTGRES_PASSWORD=idem", "POSTGRES_DB=test"}
		// The suite's Postgres pools alone may hold 120 connections, as
		// .ci/run says; the image's default allows 100 in all.
		cmd = []string{"postgres", "-c", "max_connections=300"}
		port = "5432/tcp"
		dsn = func(hp string) string { return "postgres://postgres:idem@" + hp + "/test?sslmode=disable" }
	case "mysql":
		envs = []string{"MYSQL_ROOT_PASSWORD=idem", "MYSQL_DATABASE=test"}
		port = "3306/tcp"
		dsn = func(hp string) string { return "root:idem@tcp(" + hp + ")/test" }
	default:
		return "", errors.New("no container for " + s.Name)
	}
	res, err := docker.RunWithOptions(&dockertest.RunOptions{Repository: repo, Tag: tag, Env: envs, Cmd: cmd})
	if err != nil {
		return "", err
	}
	containers = append(containers, res)
	_ = res.Expire(1800)
	d := dsn(res.GetHostPort(port))
	err = docker.Retry(func() error {
		db, err := sql.Open(s.Driver, d)
		if err != nil {
			return err
		}
		defer db.Close()
		return db.Ping()
	})
	return d, err
}

// StopContainers removes the containers this process started.
func StopContainers() {
	dockerMu.Lock()
	defer dockerMu.Unlock()
	for _, c := range containers {
		_ = docker.Purge(c)
	}
	containers = nil
}
