#!/usr/bin/env bash
# pgconns.sh runs a command (make test, say) while it samples, every half
# second, the client connections open on the PostgreSQL server that psql
# reaches with PGHOST/PGPORT/PGUSER/PGDATABASE (default: 127.0.0.1:5432,
# postgres, test), and then prints the peak of the whole server and of
# each application_name: scripts/test.sh names each module's connections
# after it. It exits with the command's status.
#
#	scripts/pgconns.sh make test
set -uo pipefail
if [ $# -eq 0 ]; then
	echo "usage: scripts/pgconns.sh COMMAND [ARG...]" >&2
	exit 2
fi
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres} PGDATABASE=${PGDATABASE:-test}
samples=$(mktemp)
trap 'rm -f "$samples"' EXIT
(
	while sleep 0.5; do
		psql -XAtF ' ' -c "SELECT now()::time(3), coalesce(nullif(application_name, ''), '-'), count(*)
			FROM pg_stat_activity WHERE backend_type = 'client backend' GROUP BY 2" >>"$samples" 2>/dev/null
	done
) &
sampler=$!
"$@"
status=$?
kill "$sampler" 2>/dev/null
wait "$sampler" 2>/dev/null
awk '{ total[$1] += $3; if ($3 > peak[$2]) peak[$2] = $3 }
END {
	for (t in total) if (total[t] > max) { max = total[t]; at = t }
	printf "pgconns: peak %d connections in all, at %s\n", max, at
	for (n in peak) printf "pgconns: %-24s peak %d\n", n, peak[n]
}' "$samples" | sort
exit "$status"
