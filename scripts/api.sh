#!/usr/bin/env bash
# api.sh records and checks the exported API of every module of the
# repository, in api/NAME.txt (api/idem.txt for the root module, else the
# module's directory with "/" made "-": api/contrib-idemgin.txt), as
# scripts/apidump prints it.
#
#   scripts/api.sh write   # record the API of every module
#   scripts/api.sh check   # fail, with a diff, where it differs from the record
set -euo pipefail
cd "$(dirname "$0")/.."
export GOWORK=off

mode=${1:-}
if [ "$mode" != write ] && [ "$mode" != check ]; then
	echo "usage: scripts/api.sh write|check" >&2
	exit 2
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
names=()
declare -A dir_of
for dir in $(git ls-files -co --exclude-standard go.mod '*/go.mod' | xargs -n1 dirname | sort); do
	if [ "$dir" = . ]; then name=idem; else name=${dir//\//-}; fi
	names+=("$name")
	dir_of[$name]=$dir
	go run ./scripts/apidump "$dir" >"$out/$name.txt"
done

if [ "$mode" = write ]; then
	rm -rf api
	mkdir api
	cp "$out"/*.txt api/
	echo "api: recorded the API of ${#names[@]} modules in api/"
	exit 0
fi

failed=0
for name in "${names[@]}"; do
	if [ ! -f "api/$name.txt" ]; then
		echo "api: module ${dir_of[$name]} has no recorded API (api/$name.txt)"
		failed=1
	elif ! diff -u --label "api/$name.txt (recorded)" --label "module ${dir_of[$name]} (now)" "api/$name.txt" "$out/$name.txt"; then
		echo "api: the exported API of module ${dir_of[$name]} differs from api/$name.txt"
		failed=1
	fi
done
for f in api/*.txt; do
	if [ -f "$f" ] && [ ! -f "$out/$(basename "$f")" ]; then
		echo "api: $f records a module that is gone"
		failed=1
	fi
done
if [ "$failed" = 1 ]; then
	echo "api: if the change is meant, run scripts/api.sh write and commit api/ with it, and name every" >&2
	echo "api: incompatible change (a removal, a changed signature or type) in CHANGELOG.md, in the" >&2
	echo "api: Unreleased section under \"Changed\" or \"Removed\", with a migration note" >&2
	exit 1
fi
echo "api: the API of ${#names[@]} modules matches api/"
