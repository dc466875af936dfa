# The test command: the whole suite, with the race detector, against the
# PostgreSQL, MariaDB and TiDB servers of a development machine (see
# DEVELOPERS.md; scripts/tidb.sh start builds and starts TiDB). Point the
# DSNs elsewhere by setting them in the environment; unset the first two
# on a machine with Docker to let the suite start those servers itself.
IDEM_TEST_POSTGRES_DSN ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
IDEM_TEST_MYSQL_DSN ?= root@tcp(127.0.0.1:3306)/test
IDEM_TEST_MARIADB_DSN ?= root@tcp(127.0.0.1:3306)/test
IDEM_TEST_TIDB_DSN ?= root@tcp(127.0.0.1:4000)/test
export IDEM_TEST_POSTGRES_DSN IDEM_TEST_MYSQL_DSN IDEM_TEST_MARIADB_DSN IDEM_TEST_TIDB_DSN

.PHONY: test check

# TestIdemAllocs skips under -race (the race detector changes allocation
# counts), so it runs a second time without.
test:
	go test -race -count=1 -timeout 20m ./...
	go test -count=1 -run TestIdemAllocs ./internal/bench

# Formatting and vet, as CI runs them.
check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	go vet ./...
