#!/usr/bin/env bash
# pgbouncer.sh starts PgBouncer (the distribution's package, 1.18 on
# Debian 12) on loopback in transaction pooling mode in front of the
# PostgreSQL of a development machine, for the conformance suite's
# targets behind a pooler.
#
#   scripts/pgbouncer.sh start   # write the configuration, start, wait until it answers
#   scripts/pgbouncer.sh stop
#
# It listens on 127.0.0.1:$IDEM_PGBOUNCER_PORT (default 6432), user
# postgres without a password (auth_type trust, as the server's own
# loopback), and serves two databases, both PostgreSQL's database test on
# $IDEM_PGBOUNCER_SERVER (default 127.0.0.1:5432):
#
#   test         a pool of 20 server connections, shared by the suite's
#                three targets behind PgBouncer, each closed after 10 s
#                unused (a stock PostgreSQL's 100 connections are shared
#                with the direct targets and the other modules' tests:
#                DEVELOPERS.md counts them);
#   test_single  a pool of one server connection, so that every
#                transaction runs on the server session the one before it
#                used: TestPooledSessionKeepsNothing reads what idem left.
#
# No server_reset_query runs between clients (PgBouncer's default in
# transaction mode): whatever a transaction leaves in the session, the
# next client's transaction finds. Its files (configuration, log, pid) are
# in $IDEM_PGBOUNCER_DIR (default /tmp/idem-pgbouncer-<uid>). PgBouncer
# refuses to run as root: under root it runs as $IDEM_PGBOUNCER_USER
# (default postgres).
set -euo pipefail

PORT=${IDEM_PGBOUNCER_PORT:-6432}
SERVER=${IDEM_PGBOUNCER_SERVER:-127.0.0.1:5432}
DIR=${IDEM_PGBOUNCER_DIR:-/tmp/idem-pgbouncer-$(id -u)}
RUN_AS=${IDEM_PGBOUNCER_USER:-postgres}
BIN=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)

answers() {
	(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null
}

configure() {
	mkdir -p "$DIR"
	local host=${SERVER%:*} port=${SERVER##*:}
	cat >"$DIR/pgbouncer.ini" <<EOF
[databases]
test = host=$host port=$port dbname=test
test_single = host=$host port=$port dbname=test pool_size=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PORT
unix_socket_dir =
auth_type = trust
auth_file = $DIR/userlist.txt
admin_users = postgres
pool_mode = transaction
default_pool_size = 20
reserve_pool_size = 0
server_idle_timeout = 10
max_client_conn = 500
logfile = $DIR/pgbouncer.log
pidfile = $DIR/pgbouncer.pid
EOF
	echo '"postgres" ""' >"$DIR/userlist.txt"
}

start() {
	if answers; then
		echo "pgbouncer: already answering on 127.0.0.1:$PORT" >&2
		return 0
	fi
	if [ ! -x "$BIN" ]; then
		echo "pgbouncer: not installed; install it (Debian: apt-get install pgbouncer) and run $0 start again" >&2
		return 1
	fi
	configure
	local run=()
	if [ "$(id -u)" = 0 ]; then
		# The log is opened by this shell (nohup's output below) and by
		# PgBouncer: made before the chown, it is the other user's too.
		: >>"$DIR/pgbouncer.log"
		chown -R "$RUN_AS" "$DIR"
		run=(runuser -u "$RUN_AS" --)
	fi
	nohup "${run[@]}" "$BIN" "$DIR/pgbouncer.ini" >>"$DIR/pgbouncer.log" 2>&1 &
	for _ in $(seq 1 30); do
		if answers; then
			echo "pgbouncer: up on 127.0.0.1:$PORT in transaction mode, in front of $SERVER" >&2
			return 0
		fi
		sleep 1
	done
	echo "pgbouncer: did not answer on 127.0.0.1:$PORT within 30s; see $DIR/pgbouncer.log" >&2
	return 1
}

stop() {
	[ -f "$DIR/pgbouncer.pid" ] && kill "$(cat "$DIR/pgbouncer.pid")" 2>/dev/null || true
	rm -f "$DIR/pgbouncer.pid"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
