#!/usr/bin/env bash
# install-check.sh installs every module of the repository as a user
# would, at the version in VERSION: it publishes each module, as a
# git archive of the work tree (its tracked and untracked files but the
# ignored ones, so in a clean clone the commit checked out), into a
# module proxy made of files; then, for each module, in a fresh module
# with no replace and no workspace, it runs go get MODULE@VERSION,
# builds a program that imports every public package of the module, and
# runs go mod tidy there (which records what the tests of those packages
# need too); it fails where the user's go.sum then names dockertest or
# Docker's modules, unless the module asked for them: only
# idemtest/containers, the tests' container fallback, and the modules
# that require it (integration_test) may.
# It prints the root module's requirement list.
#
#   scripts/install-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

command -v zip >/dev/null || { echo "install-check: needs zip (apt-get install zip)" >&2; exit 1; }
version=$(cat VERSION)
upstream=$(go env GOPROXY)
modcache=$(go env GOMODCACHE)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cp "$(git rev-parse --git-path index)" "$tmp/index"
tree=$(GIT_INDEX_FILE="$tmp/index" git add -A && GIT_INDEX_FILE="$tmp/index" git write-tree)
time=$(date -u -d "@$(git log -1 --format=%ct)" +%Y-%m-%dT%H:%M:%SZ)
dirs=$(git ls-tree -r --name-only "$tree" | grep -E '(^|/)go\.mod$' | xargs -n1 dirname | sort)

# The proxy: MODULE/@v/{list,VERSION.info,VERSION.mod,VERSION.zip}, the
# module path case-encoded (an upper-case letter is "!" and the letter);
# the zip holds the module's files under MODULE@VERSION/, those of nested
# modules left out, and no directory entries.
modules=()
declare -A public # a module's public packages: not main, not internal, not test-only
declare -A docker # the modules whose users may get Docker's modules: they require the container fallback
for dir in $dirs; do
	mod=$(awk '$1 == "module" { gsub(/"/, "", $2); print $2 }' "$dir/go.mod")
	modules+=("$mod")
	if [ "$dir" = idemtest/containers ] || grep -q 'github.com/idemkit/idem/idemtest/containers ' "$dir/go.mod"; then docker[$mod]=1; fi
	public[$mod]=$(cd "$dir" && GOWORK=off go list -find -f '{{if and .GoFiles (ne .Name "main")}}{{.ImportPath}}{{end}}' ./... |
		awk '!/(^|\/)internal(\/|$)/')
	enc=$(printf '%s' "$mod" | sed 's/[A-Z]/!\L&/g')
	at="$tmp/proxy/$enc/@v"
	mkdir -p "$at" "$tmp/zip/$mod@$version"
	if [ "$dir" = . ]; then src=$tree; else src=$tree:$dir; fi
	excludes=()
	for other in $dirs; do
		if [ "$dir" = . ] && [ "$other" != . ]; then excludes+=(":(exclude)$other"); fi
		if [ "$dir" != . ] && [[ $other == "$dir"/* ]]; then excludes+=(":(exclude)${other#"$dir"/}"); fi
	done
	git archive --format=tar "$src" -- "${excludes[@]}" | tar -x -C "$tmp/zip/$mod@$version"
	(cd "$tmp/zip" && zip -q -r -D -X "$at/$version.zip" "$mod@$version")
	cp "$tmp/zip/$mod@$version/go.mod" "$at/$version.mod"
	printf '{"Version":"%s","Time":"%s"}\n' "$version" "$time" >"$at/$version.info"
	echo "$version" >"$at/list"
	# A copy of this version in the module cache would be used instead of the proxy's.
	if [ -e "$modcache/$enc@$version" ]; then chmod -R u+w "$modcache/$enc@$version"; fi
	rm -rf "$modcache/$enc@$version" "$modcache/cache/download/$enc/@v/$version".*
done
root=${modules[0]}

# install MODULE: go get it in a fresh module, and build its public packages.
install() {
	local mod=$1 user="$tmp/user/$1" pkgs=${public[$1]}
	mkdir -p "$user"
	cd "$user"
	printf 'module example.com/installcheck\n' >go.mod
	echo "install-check: go get $mod@$version"
	go get "$mod@$version" >"$user/log" 2>&1 || { cat "$user/log" >&2; return 1; }
	if [ -z "$pkgs" ]; then
		echo "install-check: $mod has no public package to build"
		return 0
	fi
	{
		printf 'package main\n\n'
		echo "$pkgs" | sed 's/.*/import _ "&"/'
		printf '\nfunc main() {}\n'
	} >main.go
	go build -o /dev/null . >"$user/log" 2>&1 || { cat "$user/log" >&2; return 1; }
	echo "install-check: built its public packages: $(echo "$pkgs" | paste -sd ' ')"
	go mod tidy >"$user/log" 2>&1 || { cat "$user/log" >&2; return 1; }
	local heavy
	heavy=$(awk '$1 ~ /^github\.com\/(ory\/dockertest|docker\/)/ { print $1 }' go.sum | sort -u | paste -sd ' ')
	if [ -n "$heavy" ] && [ -z "${docker[$mod]:-}" ]; then
		echo "install-check: go mod tidy puts Docker's modules in the go.sum of a user of $mod: $heavy" >&2
		return 1
	fi
	echo "install-check: its user's go.sum, tidy, has $(wc -l <go.sum) lines${heavy:+, and the Docker modules it asked for: $heavy}"
}

# No workspace and no replace; the repository's modules from the proxy
# above and not in the checksum database. The go command's index of a
# module in the module cache (kept in GOCACHE) is keyed by its path@version
# alone: goindex=0 keeps the index of an earlier archive at this version
# from hiding the new archive's packages.
export GOWORK=off GOFLAGS=-mod=mod GONOSUMDB=$root GOPROXY="file://$tmp/proxy,$upstream"
export GODEBUG=${GODEBUG:+$GODEBUG,}goindex=0
failed=()
for mod in "${modules[@]}"; do
	install "$mod" || failed+=("$mod")
	if [ "$mod" = "$root" ] && [ -f "$tmp/user/$root/main.go" ]; then
		echo "install-check: the requirements of $root@$version:"
		(cd "$tmp/user/$root" && go mod graph | awk -v m="$root@$version" '$1 == m { print "  " $2 }')
	fi
done
if [ ${#failed[@]} -gt 0 ]; then
	echo "install-check: a user cannot install these modules at $version: ${failed[*]}" >&2
	exit 1
fi
echo "install-check: all ${#modules[@]} modules install at $version"
