#!/usr/bin/env bash
# release.sh prepares the release of every module of the repository at
# one version: it writes VERSION, makes every go.mod require the
# repository's own modules at that version, copies LICENSE into every
# module directory, runs the API check and the install check, moves the
# Unreleased entries of CHANGELOG.md under a heading for the version,
# and prints the tags to push. It commits, tags and pushes nothing, and
# running it again with the same version changes nothing.
#
#   scripts/release.sh v0.1.0     (or: make release VERSION=v0.1.0)
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:-}
if ! [[ $version =~ ^v[01]\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$ ]]; then
	echo "usage: scripts/release.sh vX.Y.Z (v0 or v1: a v2 needs /v2 module paths)" >&2
	exit 2
fi
grep -q '^## \[Unreleased\]$' CHANGELOG.md || { echo "release: CHANGELOG.md has no '## [Unreleased]' heading" >&2; exit 1; }

modpath() { awk '$1 == "module" { gsub(/"/, "", $2); print $2 }' "$1"; }
requires() { # go.mod, module: whether the go.mod has a require line for the module
	go mod edit -json "$1" | tr -d ' \t\n' | grep -o '"Require":\[[^]]*\]' | grep -q "\"Path\":\"$2\""
}
dirs=$(git ls-files -co --exclude-standard go.mod '*/go.mod' | xargs -n1 dirname | sort)
modules=$(for dir in $dirs; do modpath "$dir/go.mod"; done)

echo "$version" >VERSION
for dir in $dirs; do
	for mod in $modules; do
		if requires "$dir/go.mod" "$mod"; then go mod edit -require="$mod@$version" "$dir/go.mod"; fi
	done
	if [ "$dir" != . ]; then cp LICENSE "$dir/LICENSE"; fi
done
echo "release: VERSION, the requirements of the repository's own modules and every LICENSE copy are at $version"

scripts/api.sh check
scripts/install-check.sh

release=${version#v}
if grep -q "^## \[$release\]" CHANGELOG.md; then
	echo "release: CHANGELOG.md already has a section for $release"
else
	repo=https://$(modpath go.mod)
	previous=$(sed -n 's/^## \[\([0-9][^]]*\)\].*/\1/p' CHANGELOG.md | head -n 1)
	if [ -n "$previous" ]; then link=$repo/compare/v$previous...$version; else link=$repo/releases/tag/$version; fi
	sed -i -e "s|^## \[Unreleased\]\$|&\n\n## [$release] - $(date -u +%Y-%m-%d)|" \
		-e "s|^\[Unreleased\]: .*|[Unreleased]: $repo/compare/$version...HEAD\n[$release]: $link|" CHANGELOG.md
	echo "release: CHANGELOG.md: the Unreleased entries are now under [$release]"
fi

tags=$(for dir in $dirs; do if [ "$dir" = . ]; then echo "$version"; else echo "$dir/$version"; fi; done)
echo "release: review and commit the changes, then tag that commit and push its tags:"
for tag in $tags; do echo "  git tag $tag"; done
echo "  git push origin $(echo "$tags" | paste -sd ' ')"
