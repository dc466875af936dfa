#!/usr/bin/env bash
# test.sh is make test: the tests of every module of the repository, with
# the race detector. The root module's suite runs in the foreground; the
# modules under contrib/ run one after another beside it (their tests
# mostly wait on the databases, as the root's do), each against its own
# go.mod (GOWORK=off), and their output follows the root's. Then
# TestIdemAllocs runs again without the race detector, under which it
# skips. It fails when any module fails.
set -uo pipefail
cd "$(dirname "$0")/.."
export GOWORK=off

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
contrib=$(ls contrib/*/go.mod 2>/dev/null | xargs -r -n1 dirname | sort)

(
	for m in $contrib; do
		name=$(basename "$m")
		if ! (cd "$m" && go test -race -count=1 -timeout 20m ./...) >"$logs/$name.log" 2>&1; then
			touch "$logs/$name.failed"
		fi
	done
) &
others=$!

echo "== ."
go test -race -count=1 -timeout 20m ./...
failed=$?
wait "$others"

for m in $contrib; do
	name=$(basename "$m")
	echo "== $m"
	cat "$logs/$name.log"
	if [ -e "$logs/$name.failed" ]; then
		failed=1
	fi
done

echo "== TestIdemAllocs, without the race detector"
go test -count=1 -run TestIdemAllocs ./internal/bench || failed=1
exit "$failed"
