#!/usr/bin/env bash
# test.sh is make test: the tests of every module of the repository, with
# the race detector, each against its own go.mod (GOWORK=off). First
# idemtest's command testdb finds the database servers (the DSNs set in
# IDEM_TEST_*_DSN, else a development machine's servers at their usual
# addresses) and their DSNs are exported to every test. The root module's
# suite runs first (internal/bench's pools would not fit beside the
# conformance suite's in a stock PostgreSQL's 100 connections); then
# integration_test (the conformance suite, then the other tests on
# servers) and, beside it, one after another, idemtest and the modules
# under contrib/ (their tests mostly wait on the databases), and their
# output follows the root's. Then
# TestIdemAllocs runs again without the race detector, under which it
# skips. It ends with the line that names each server that was missing
# and how to start it, and fails when any module fails.
set -uo pipefail
cd "$(dirname "$0")/.."
export GOWORK=off

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

if ! (cd idemtest && go run ./cmd/testdb) >"$logs/servers.sh" 2>"$logs/missing"; then
	cat "$logs/missing" >&2
	exit 1
fi
# shellcheck disable=SC1091
. "$logs/servers.sh"

# withName prints the PostgreSQL DSN $1 (a URL; any other form as it is)
# with application_name $2.
withName() {
	case $1 in
	postgres://*\?* | postgresql://*\?*) printf '%s&application_name=%s' "$1" "$2" ;;
	postgres://* | postgresql://*) printf '%s?application_name=%s' "$1" "$2" ;;
	*) printf '%s' "$1" ;;
	esac
}

# named runs a command with the PostgreSQL DSNs (the server's and
# PgBouncer's) naming their connections $1, so that pg_stat_activity
# counts each module's tests by its name (DEVELOPERS.md).
named() {
	local name=$1
	shift
	IDEM_TEST_POSTGRES_DSN=$(withName "${IDEM_TEST_POSTGRES_DSN:-}" "$name") \
		IDEM_TEST_PGBOUNCER_DSN=$(withName "${IDEM_TEST_PGBOUNCER_DSN:-}" "$name") \
		IDEM_TEST_PGBOUNCER_SINGLE_DSN=$(withName "${IDEM_TEST_PGBOUNCER_SINGLE_DSN:-}" "$name") \
		"$@"
}

# run tests module $1 with the race detector into its log: the packages
# $2 (a pattern or a list; default ./...).
run() {
	local name=${1//\//-}
	# shellcheck disable=SC2086 # $2 is a list of packages
	if ! (cd "$1" && named "$name" go test -race -count=1 -timeout 20m ${2:-./...}) >>"$logs/$name.log" 2>&1; then
		touch "$logs/$name.failed"
	fi
}

# integration_test's conformance suite (its root package), then its other
# packages: the suite holds up to 36 PostgreSQL connections and
# PgBouncer's 20, the idem command's bench up to 40, so they take turns
# on a stock server's 100 beside the root module's and contrib's tests
# (DEVELOPERS.md counts them).
integration_run() {
	run integration_test .
	run integration_test "$(cd integration_test && go list ./... | grep -vx github.com/idemkit/idem/integration_test | paste -sd ' ')"
}

integration=integration_test
others="idemtest idemtest/containers idemtest/conformance $(ls contrib/*/go.mod 2>/dev/null | xargs -r -n1 dirname | sort)"

echo "== ."
named root go test -race -count=1 -timeout 20m ./...
failed=$?

integration_run &
integration_pid=$!
(
	for m in $others; do
		run "$m"
	done
) &
others_pid=$!
wait "$integration_pid" "$others_pid"

for m in $integration $others; do
	name=${m//\//-}
	echo "== $m"
	cat "$logs/$name.log"
	if [ -e "$logs/$name.failed" ]; then
		failed=1
	fi
done

echo "== TestIdemAllocs, without the race detector"
go test -count=1 -run TestIdemAllocs ./internal/bench || failed=1
cat "$logs/missing" >&2
exit "$failed"
