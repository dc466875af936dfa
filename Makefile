# The test command: the tests of every module of the repository (the root
# module and each one under contrib/), with the race detector, against the
# database servers package internal/testdb finds: the DSNs set in
# IDEM_TEST_POSTGRES_DSN, IDEM_TEST_MYSQL_DSN, IDEM_TEST_MARIADB_DSN,
# IDEM_TEST_TIDB_DSN and IDEM_TEST_PGBOUNCER_DSN, else a development
# machine's servers at their usual addresses (DEVELOPERS.md), else
# containers where Docker runs. A server that is missing skips its tests
# with a message, or fails them under IDEM_TEST_REQUIRE=1 (as in CI).
MODULES := . $(patsubst %/go.mod,%,$(sort $(wildcard contrib/*/go.mod)))
export GOWORK := off

.PHONY: test check

# The root module's suite in the foreground, the contrib modules beside
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
