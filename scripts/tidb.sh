#!/usr/bin/env bash
# tidb.sh builds TiDB's own server at a pinned version into a cache
# directory, once per machine, and starts it standalone on its embedded
# storage (unistore), listening on loopback only.
#
#   scripts/tidb.sh build   # build into the cache unless it is there
#   scripts/tidb.sh start   # build if needed, start on 127.0.0.1:$IDEM_TIDB_PORT, wait until it answers
#   scripts/tidb.sh stop
#
# The cache is $IDEM_TIDB_CACHE (default ~/.cache/idem/tidb-<version>).
# A cold build takes about 12 minutes and 2.4 GB on two cores.
set -euo pipefail

TIDB_VERSION=v1.1.0-beta.0.20251126154744-e4e814fdc0af # master of 2025-11-26
PARSER_VERSION=v0.0.0-20251126154744-e4e814fdc0af      # the same commit's pkg/parser
CACHE=${IDEM_TIDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/idem/tidb-$TIDB_VERSION}
BIN=$CACHE/tidb-server
PORT=${IDEM_TIDB_PORT:-4000}
STATUS_PORT=${IDEM_TIDB_STATUS_PORT:-10080}

moddir() { # module@version: the directory of the downloaded module
	go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

build() {
	[ -x "$BIN" ] && return 0
	echo "tidb: building tidb-server $TIDB_VERSION into $CACHE" >&2
	mkdir -p "$CACHE"
	local src=$CACHE/src
	rm -rf "$src"
	# The module's zip leaves out pkg/parser, which its go.mod replaces
	# with ./pkg/parser: put the parser module of the same commit there.
	cp -r "$(moddir "github.com/pingcap/tidb@$TIDB_VERSION")" "$src"
	chmod -R u+w "$src"
	rm -rf "$src/pkg/parser"
	cp -r "$(moddir "github.com/pingcap/tidb/pkg/parser@$PARSER_VERSION")" "$src/pkg/parser"
	chmod -R u+w "$src/pkg/parser"
	(cd "$src" && GOFLAGS=-mod=mod go build -o "$BIN.tmp" ./cmd/tidb-server)
	mv "$BIN.tmp" "$BIN"
	rm -rf "$src"
}

answers() {
	(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

start() {
	build
	if answers; then
		echo "tidb: already answering on 127.0.0.1:$PORT" >&2
		return 0
	fi
	mkdir -p "$CACHE/run"
	nohup "$BIN" -store unistore -path "" -host 127.0.0.1 -P "$PORT" \
		-status "$STATUS_PORT" -status-host 127.0.0.1 \
		-log-file "$CACHE/run/tidb.log" -log-slow-query "$CACHE/run/tidb-slow.log" \
		>"$CACHE/run/stdout.log" 2>&1 &
	echo $! >"$CACHE/run/pid"
	for _ in $(seq 1 120); do
		if answers; then
			echo "tidb: up on 127.0.0.1:$PORT" >&2
			return 0
		fi
		sleep 1
	done
	echo "tidb: did not answer on 127.0.0.1:$PORT within 120s; see $CACHE/run/tidb.log" >&2
	return 1
}

stop() {
	[ -f "$CACHE/run/pid" ] && kill "$(cat "$CACHE/run/pid")" 2>/dev/null || true
	rm -f "$CACHE/run/pid"
}

case "${1:-}" in
build) build ;;
start) start ;;
stop) stop ;;
*)
	echo "usage: $0 build|start|stop" >&2
	exit 2
	;;
esac
