#!/usr/bin/env bash
# galera.sh runs a three-node MariaDB Galera cluster (multi-primary) on
# loopback, for the conformance suite's galera target: the distribution's
# MariaDB server and galera-4 provider (10.11 and 26.4 on Debian 12),
# each node with data of its own, small buffer pools and rsync SST.
#
#   scripts/galera.sh start   # bootstrap node 1, join nodes 2 and 3, wait until all three are Synced
#   scripts/galera.sh stop
#
# The nodes listen on 127.0.0.1:3311, 3312 and 3313 (MySQL protocol,
# root without a password, database test), their group communication on
# 4571-4573, IST on 4581-4583 and SST on 4591-4593; the shared server on
# 3306 is never touched. Each node's files (configuration, data, error
# log) are in $IDEM_GALERA_DIR/nodeN (default /var/tmp/idem-galera-<uid>).
# A start of a running cluster changes nothing; a start after a stop
# bootstraps anew (pc.recovery is off, and the data is made again), about
# 45 s cold on two cores. Under root the nodes run as $IDEM_GALERA_USER
# (default mysql): rsync SST's receiving daemon, run as root, writes as
# nobody, and a joiner then cannot make its data directory's files.
#
# Where the packages are missing (a fresh CI machine):
#   apt-get install -y rsync galera-4
set -euo pipefail

DIR=${IDEM_GALERA_DIR:-/var/tmp/idem-galera-$(id -u)}
PROVIDER=${IDEM_GALERA_PROVIDER:-/usr/lib/galera/libgalera_smm.so}
NODES=(1 2 3)
USER_NAME=$(id -un)
AS_USER=()
if [ "$(id -u)" = 0 ]; then
	USER_NAME=${IDEM_GALERA_USER:-mysql}
	AS_USER=(runuser -u "$USER_NAME" --)
fi

port() { echo $((3310 + $1)); }

answers() { # node
	(exec 3<>"/dev/tcp/127.0.0.1/$(port "$1")") 2>/dev/null
}

sql() { # node, statement: run through the node's socket
	mariadb --no-defaults -S "$DIR/node$1/mysqld.sock" -u root -N -B -e "$2"
}

running() { # node: its pid file names a live process
	[ -f "$DIR/node$1/mysqld.pid" ] && kill -0 "$(cat "$DIR/node$1/mysqld.pid")" 2>/dev/null
}

configure() { # node
	local n=$1 d=$DIR/node$1
	mkdir -p "$d/data"
	cat >"$d/my.cnf" <<EOF
[mysqld]
user=$USER_NAME
datadir=$d/data
socket=$d/mysqld.sock
pid-file=$d/mysqld.pid
log-error=$d/error.log
port=$(port "$n")
bind-address=127.0.0.1
skip-name-resolve
max_connections=300
innodb_buffer_pool_size=64M
innodb_log_file_size=64M
innodb_flush_log_at_trx_commit=2
default_storage_engine=InnoDB
binlog_format=ROW
innodb_autoinc_lock_mode=2
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=idem
wsrep_cluster_address=gcomm://127.0.0.1:4571,127.0.0.1:4572,127.0.0.1:4573
wsrep_node_name=node$n
wsrep_node_address=127.0.0.1
wsrep_provider_options="gmcast.listen_addr=tcp://127.0.0.1:$((4570 + n));ist.recv_addr=127.0.0.1:$((4580 + n));gcache.size=64M;pc.recovery=false"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$((4590 + n))
wsrep_slave_threads=2
EOF
}

launch() { # node, extra arguments of mariadbd
	local n=$1 d=$DIR/node$1
	shift
	nohup "${AS_USER[@]}" /usr/sbin/mariadbd --defaults-file="$d/my.cnf" "$@" >>"$d/stdout.log" 2>&1 &
}

synced() { # node: Synced, in a primary component of three
	[ "$(sql "$1" "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_local_state_comment'" 2>/dev/null)" = Synced ] &&
		[ "$(sql "$1" "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'wsrep_cluster_size'" 2>/dev/null)" = 3 ]
}

wait_for() { # what, seconds, command...
	local what=$1 secs=$2
	shift 2
	for _ in $(seq 1 "$secs"); do
		if "$@"; then return 0; fi
		sleep 1
	done
	echo "galera: $what within ${secs}s; see $DIR/node*/error.log" >&2
	return 1
}

start() {
	if answers 1 && answers 2 && answers 3 && synced 1 && synced 2 && synced 3; then
		echo "galera: already running on 127.0.0.1:3311-3313" >&2
		return 0
	fi
	if [ ! -r "$PROVIDER" ] || ! command -v rsync >/dev/null 2>&1; then
		echo "galera: the galera-4 provider ($PROVIDER) or rsync is missing; install them (Debian: apt-get install -y rsync galera-4) and run $0 start again" >&2
		return 1
	fi
	stop
	rm -rf "$DIR"
	for n in "${NODES[@]}"; do configure "$n"; done
	chown -R "$USER_NAME" "$DIR"
	"${AS_USER[@]}" mariadb-install-db --defaults-file="$DIR/node1/my.cnf" --auth-root-authentication-method=normal \
		--skip-test-db >"$DIR/node1/install.log" 2>&1
	launch 1 --wsrep-new-cluster
	wait_for "node 1 did not answer" 60 answers 1
	sql 1 "CREATE USER IF NOT EXISTS root@'127.0.0.1'; GRANT ALL ON *.* TO root@'127.0.0.1' WITH GRANT OPTION; CREATE DATABASE IF NOT EXISTS test"
	# The joiners' data comes from node 1 by SST, one at a time: two at
	# once would both ask node 1 to donate.
	launch 2
	wait_for "node 2 did not join" 90 answers 2
	launch 3
	wait_for "node 3 did not join" 90 answers 3
	for n in "${NODES[@]}"; do wait_for "node $n did not reach Synced in a cluster of 3" 60 synced "$n"; done
	echo "galera: up on 127.0.0.1:3311, 3312 and 3313, Synced, cluster size 3" >&2
}

stop() {
	for n in "${NODES[@]}"; do
		if running "$n"; then kill "$(cat "$DIR/node$n/mysqld.pid")"; fi
	done
	for n in "${NODES[@]}"; do
		for _ in $(seq 1 30); do
			running "$n" || break
			sleep 1
		done
		# A node whose threads hang (a wedged cluster) does not shut
		# down: its data is made anew at the next start anyway.
		if running "$n"; then kill -9 "$(cat "$DIR/node$n/mysqld.pid")"; fi
	done
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*)
	echo "usage: $0 start|stop" >&2
	exit 2
	;;
esac
