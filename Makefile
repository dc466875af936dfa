# The test command: the tests of every module of the repository (the root
# module, idemtest, integration_test and each one under contrib/), with
# the race detector, against the database servers package
# idemtest/testdb finds: the DSNs set in
# IDEM_TEST_POSTGRES_DSN, IDEM_TEST_MYSQL_DSN, IDEM_TEST_MARIADB_DSN,
# IDEM_TEST_TIDB_DSN and IDEM_TEST_PGBOUNCER_DSN, else a development
# machine's servers at their usual addresses (DEVELOPERS.md), else, for
# integration_test's, containers where Docker runs. A server that is
# missing skips its tests with a message, or fails them under
# IDEM_TEST_REQUIRE=1 (as in CI). A stock PostgreSQL's 100 connections
# are enough.
MODULES := . idemtest idemtest/containers idemtest/conformance integration_test $(patsubst %/go.mod,%,$(sort $(wildcard contrib/*/go.mod)))
export GOWORK := off

.PHONY: test check api api-check install-check license-check release

# The root module's suite in the foreground, the other modules beside
# it, then TestIdemAllocs without the race detector (it skips under it):
# scripts/test.sh.
test:
	scripts/test.sh

# Formatting, vet and tidy go.mod files, in every module, as CI runs them.
check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	@for m in $(MODULES); do \
		echo "== $$m"; \
		(cd $$m && go vet ./... && go mod tidy -diff) || exit 1; \
	done

# Record the exported API of every module in api/: scripts/api.sh.
api:
	scripts/api.sh write

# Fail where a module's exported API differs from its record in api/.
api-check:
	scripts/api.sh check

# Install every module as a user does, at the version in VERSION:
# scripts/install-check.sh.
install-check:
	scripts/install-check.sh

# Every module's directory holds a LICENSE identical to the root's.
license-check:
	@for m in $$(git ls-files -co --exclude-standard go.mod '*/go.mod' | xargs -n1 dirname); do \
		cmp -s LICENSE $$m/LICENSE || { echo "license-check: $$m/LICENSE is missing or differs from ./LICENSE (scripts/release.sh copies it)"; exit 1; }; \
	done

# make release VERSION=vX.Y.Z: scripts/release.sh.
release:
	scripts/release.sh $(VERSION)
