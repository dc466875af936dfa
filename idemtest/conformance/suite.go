package conformance

import (
	"os"
	"testing"
)

// suite is every conformance test. Each runs on every target (or on the
// targets of the dialect it is about) as subtests of its own.
var suite = []struct {
	name string
	test func(*testing.T)
}{
	{"TestBeginOutcomes", TestBeginOutcomes},
	{"TestConcurrentTakeover", TestConcurrentTakeover},
	{"TestStaleCompleteIsFenced", TestStaleCompleteIsFenced},
	{"TestFencingSurvivesPurge", TestFencingSurvivesPurge},
	{"TestNeighboursAtOnce", TestNeighboursAtOnce},
	{"TestRelease", TestRelease},
	{"TestExtend", TestExtend},
	{"TestRelayKey", TestRelayKey},
	{"TestDatabaseClockOnly", TestDatabaseClockOnly},
	{"TestLockTimeout", TestLockTimeout},
	{"TestFreshKeyCommitsWithBusinessRows", TestFreshKeyCommitsWithBusinessRows},
	{"TestReplayIsByteIdentical", TestReplayIsByteIdentical},
	{"TestStormRunsOnce", TestStormRunsOnce},
	{"TestMismatch", TestMismatch},
	{"TestFingerprintChanged", TestFingerprintChanged},
	{"TestTypedCall", TestTypedCall},
	{"TestScopesAreSeparate", TestScopesAreSeparate},
	{"TestFnErrorStoresNothing", TestFnErrorStoresNothing},
	{"TestApply", TestApply},
	{"TestApplyTakesOver", TestApplyTakesOver},
	{"TestApplyStorm", TestApplyStorm},
	{"TestKeys", TestKeys},
	{"TestOldSnapshotSeesWinner", TestOldSnapshotSeesWinner},
	{"TestSqlxTx", TestSqlxTx},
	{"TestLeftClaim", TestLeftClaim},
	{"TestInvalidRequests", TestInvalidRequests},
	{"TestRetention", TestRetention},
	{"TestRetentionPerRequest", TestRetentionPerRequest},
	{"TestKeyMemory", TestKeyMemory},
	{"TestKeyMemoryKeptByTheRecord", TestKeyMemoryKeptByTheRecord},
	{"TestKeyMemoryOfEarlierRecords", TestKeyMemoryOfEarlierRecords},
	{"TestExpiredReference", TestExpiredReference},
	{"TestSealedResponses", TestSealedResponses},
	{"TestSealedRowsTampered", TestSealedRowsTampered},
	{"TestRotationMidTraffic", TestRotationMidTraffic},
	{"TestSessionUntouched", TestSessionUntouched},
	{"TestStatementCounts", TestStatementCounts},
	{"TestCompletedKeyHint", TestCompletedKeyHint},
	{"TestReadFirstWhileReplaying", TestReadFirstWhileReplaying},
	{"TestRetryHint", TestRetryHint},
	{"TestReplayCache", TestReplayCache},
	{"TestMigrate", TestMigrate},
	{"TestMigrateNewTableDoesNotWait", TestMigrateNewTableDoesNotWait},
	{"TestUpgradeFromEarlierVersions", TestUpgradeFromEarlierVersions},
	{"TestMigrateLeavesNewerLayout", TestMigrateLeavesNewerLayout},
	{"TestMigrateRebuildsAFailedIndexBuild", TestMigrateRebuildsAFailedIndexBuild},
	{"TestUpgradeUnderLoad", TestUpgradeUnderLoad},
	{"TestPostgresReplayWritesNothing", TestPostgresReplayWritesNothing},
	{"TestOnlyTransactionsAccepted", TestOnlyTransactionsAccepted},
	{"TestErrorsSayWhatToDo", TestErrorsSayWhatToDo},
	{"TestOlderTableNamed", TestOlderTableNamed},
	{"TestDeadlockInFn", TestDeadlockInFn},
	{"TestInterruptInFn", TestInterruptInFn},
	{"TestBeginLeaseCountsFromGrant", TestBeginLeaseCountsFromGrant},
	{"TestAbortedTxMessage", TestAbortedTxMessage},
	{"TestKillMidDo", TestKillMidDo},
	{"TestLostCommit", TestLostCommit},
	{"TestCrashAfterBegin", TestCrashAfterBegin},
	{"TestCompleteBetweenReadAndWrite", TestCompleteBetweenReadAndWrite},
	{"TestFaultHistory", TestFaultHistory},
	{"TestRandomHistory", TestRandomHistory},
	{"TestPipelinedClaimWaits", TestPipelinedClaimWaits},
	{"TestPipelinedClaimFails", TestPipelinedClaimFails},
	{"TestPipelinedSnapshot", TestPipelinedSnapshot},
	{"TestPipelinedCommitFails", TestPipelinedCommitFails},
	{"TestPipelinedCancel", TestPipelinedCancel},
	{"TestPipelinedHandlerError", TestPipelinedHandlerError},
	{"TestPipelinedRoundTrips", TestPipelinedRoundTrips},
	{"TestPipelinedApply", TestPipelinedApply},
	{"TestHTTPConcurrentDuplicates", TestHTTPConcurrentDuplicates},
	{"TestHTTPRetryingClientsConverge", TestHTTPRetryingClientsConverge},
	{"TestHTTPHeaderForms", TestHTTPHeaderForms},
	{"TestHTTPProblems", TestHTTPProblems},
	{"TestHTTPFingerprintSelection", TestHTTPFingerprintSelection},
	{"TestHTTPReplayHeaders", TestHTTPReplayHeaders},
	{"TestHTTPFailuresNotStored", TestHTTPFailuresNotStored},
	{"TestHTTPStreamingRefused", TestHTTPStreamingRefused},
	{"TestHTTPScopeReadsBody", TestHTTPScopeReadsBody},
	{"TestHTTPPassThrough", TestHTTPPassThrough},
	{"TestHTTPClaimSlowProvider", TestHTTPClaimSlowProvider},
	{"TestHTTPClaimFailuresRelease", TestHTTPClaimFailuresRelease},
	{"TestHTTPClaimLeaseLost", TestHTTPClaimLeaseLost},
	{"TestHTTPClientGivesUp", TestHTTPClientGivesUp},
	{"TestHTTPDuplicatesWaitInMemory", TestHTTPDuplicatesWaitInMemory},
	{"TestHTTPRetryAfter", TestHTTPRetryAfter},
	{"TestHTTPScopeIsolatesCallers", TestHTTPScopeIsolatesCallers},
	{"TestHTTPTimeout", TestHTTPTimeout},
	{"TestHTTPRetryNumberReadsFirst", TestHTTPRetryNumberReadsFirst},
	{"TestHTTPReplayCache", TestHTTPReplayCache},
	{"TestHTTPLockTimeoutBoundsEveryWait", TestHTTPLockTimeoutBoundsEveryWait},
	{"TestObserver", TestObserver},
	{"TestObserverClaims", TestObserverClaims},
	{"TestDailyPartitionsRunAKeyTwice", TestDailyPartitionsRunAKeyTwice},
	{"TestPurge", TestPurge},
	{"TestPurgeSweeps", TestPurgeSweeps},
	{"TestPurgeAcrossGaps", TestPurgeAcrossGaps},
	{"TestPurgeBatchesRunTogether", TestPurgeBatchesRunTogether},
	{"TestPurgeDeletesABacklogPastItsForgetTime", TestPurgeDeletesABacklogPastItsForgetTime},
	{"TestPurgePassesOverHeldRows", TestPurgePassesOverHeldRows},
	{"TestInspectAndStatsAgreeWithPurge", TestInspectAndStatsAgreeWithPurge},
	{"TestInspectKeyAcrossScopes", TestInspectKeyAcrossScopes},
	{"TestSchemaFaultsSayWhatToDo", TestSchemaFaultsSayWhatToDo},
	{"TestPurgeBatchDoesNotBlockClaims", TestPurgeBatchDoesNotBlockClaims},
	{"TestPurgeUnderLoad", TestPurgeUnderLoad},
	{"TestPooledSessionKeepsNothing", TestPooledSessionKeepsNothing},
	{"TestPoolerStatementCacheNamesTheFix", TestPoolerStatementCacheNamesTheFix},
	{"TestDuplicatesAcrossNodesRunOnce", TestDuplicatesAcrossNodesRunOnce},
	{"TestCommittedOnAnotherNodeReplays", TestCommittedOnAnotherNodeReplays},
	{"TestCompleteOnAnotherNode", TestCompleteOnAnotherNode},
	{"TestClaimsAcrossNodesCallOnce", TestClaimsAcrossNodesCallOnce},
	{"TestLeaseLostIsNotRetryable", TestLeaseLostIsNotRetryable},
	{"TestSessionWithoutCausalReads", TestSessionWithoutCausalReads},
	{"TestTransactionModeRefusedWithoutStreaming", TestTransactionModeRefusedWithoutStreaming},
	{"TestSQLiteBusyIsRetryable", TestSQLiteBusyIsRetryable},
	{"TestSQLiteSettings", TestSQLiteSettings},
	{"TestTiDBRefusesUnsafeSessions", TestTiDBRefusesUnsafeSessions},
	{"TestTiDBRefusesSerializable", TestTiDBRefusesSerializable},
	{"TestTiDBBeginStatementDecides", TestTiDBBeginStatementDecides},
	{"TestTiDBLazyCheckLetsDuplicatesThrough", TestTiDBLazyCheckLetsDuplicatesThrough},
}

// Run runs the whole conformance suite, each test on every target: a
// dialect through one driver on a real server (targets.go). A new dialect
// or driver is one more target there; see docs/dialects.md. Run is meant
// to be called once per test binary, from a Test function: it makes the
// embedded databases' directory, and removes it when t ends. The
// containers that the targets' servers may start in are the TestMain's
// (idemtest/containers.Main) to remove.
func Run(t *testing.T) {
	dir, err := os.MkdirTemp("", "idem-test-")
	if err != nil {
		t.Fatal(err)
	}
	tempDir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, s := range suite {
		t.Run(s.name, s.test)
	}
}
