package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"time"
)

// TiDB's side of TestScale: what settles and what is left to reclaim on
// TiDB, and the two purges TiDB offers of its own, measured beside the
// Store's (IDEM_SCALE_TIDB_PURGE).

// tidbSettle reports the table's regions after the fill. TiDB has no
// dirty pages or history list to wait for through SQL, and the fill's
// ANALYZE TABLE leaves auto analyze nothing to do; TiKV's compaction of
// the fill goes on beside the runs, as it would beside any bulk load.
func (st *scaleTable) tidbSettle(ctx context.Context) (string, error) {
	return fmt.Sprintf("%d regions", st.tidbRegions(ctx)), nil
}

// tidbRegions counts the regions of the table's rows, or -1. (SHOW TABLE
// ... REGIONS asks the store, where information_schema.TIKV_REGION_STATUS
// asks PD, which the standalone server has none of.)
func (st *scaleTable) tidbRegions(ctx context.Context) int64 {
	rows, err := st.db.QueryContext(ctx, "SHOW TABLE "+st.store.Table()+" REGIONS")
	if err != nil {
		return -1
	}
	defer rows.Close()
	var n int64
	for rows.Next() {
		n++
	}
	if rows.Err() != nil {
		return -1
	}
	return n
}

// tidbReclaim reports what TiDB has left to reclaim after the purge: the
// deleted rows stay as MVCC versions until GC passes them, so it says when
// GC last ran and up to when (no row in mysql.tidb when GC has never run:
// the standalone server on its embedded storage starts no GC worker), and
// the table's regions.
func (st *scaleTable) tidbReclaim(ctx context.Context) string {
	var last, safe sql.NullString
	_ = st.db.QueryRowContext(ctx, `SELECT MAX(CASE WHEN variable_name = 'tikv_gc_last_run_time' THEN variable_value END),
  MAX(CASE WHEN variable_name = 'tikv_gc_safe_point' THEN variable_value END)
FROM mysql.tidb WHERE variable_name IN ('tikv_gc_last_run_time', 'tikv_gc_safe_point')`).Scan(&last, &safe)
	gc := "GC has never run"
	if last.Valid {
		gc = fmt.Sprintf("GC last ran %s, safe point %s", last.String, safe.String)
	}
	return fmt.Sprintf("%s; %d regions", gc, st.tidbRegions(ctx))
}

// tidbPhase purges with TiDB's own means instead of the Store's, beside
// the workers, for cfg.purgeFor at most (0: until done), and prints the
// phase's rate as purgePhase does. purgers is ignored: each means has
// its own concurrency (the non-transactional DML one statement, the TTL
// job tidb_ttl_delete_worker_count workers).
//
//   - batch runs BATCH ON expires_at LIMIT cfg.batch DELETE of the due
//     records that are not live claims, in autocommit, until it deletes
//     nothing (a run covers what was due when it split the range).
//   - ttl gives the table the TTL attribute on expires_at, its job every
//     minute, and waits for a job that began after it to finish. It
//     removes the attribute again afterwards.
//
// Both count what they deleted from the table's records (counted).
func (st *scaleTable) tidbPhase(ctx context.Context, cfg scaleConfig, _ int, done func() int) (int64, error) {
	if cfg.tidbPurge == "ttl" {
		return st.counted(ctx, "TTL job", done, func(start time.Time) (string, error) { return st.tidbTTL(ctx, cfg, start) })
	}
	return st.counted(ctx, "BATCH ON ... DELETE", done, func(start time.Time) (string, error) {
		for cfg.purgeFor == 0 || time.Since(start) < cfg.purgeFor {
			var jobs int64
			var status string
			if err := st.db.QueryRowContext(ctx, `BATCH ON expires_at LIMIT `+strconv.Itoa(cfg.batch)+` DELETE FROM `+st.store.Table()+`
WHERE expires_at <= UTC_TIMESTAMP(6) AND NOT (status = 'processing' AND lease_until > UTC_TIMESTAMP(6))`).Scan(&jobs, &status); err != nil {
				return "", fmt.Errorf("BATCH ON ... DELETE: %w", err)
			}
			if status != "all succeeded" {
				return "", fmt.Errorf("BATCH ON ... DELETE: %d jobs, %s", jobs, status)
			}
			if jobs == 0 {
				return "done", nil
			}
		}
		return "stopped at IDEM_SCALE_PURGE_FOR", nil
	})
}

// counted runs purge, which deletes with one of TiDB's own means from
// start on and says how it ended, and counts what it deleted as the
// table's records before, less those after, plus those the workers added
// between; it prints the phase's rate as purgePhase does.
func (st *scaleTable) counted(ctx context.Context, what string, done func() int, purge func(start time.Time) (string, error)) (int64, error) {
	before, err := st.tidbCount(ctx)
	if err != nil {
		return 0, err
	}
	start, done0 := time.Now(), done()
	ended, err := purge(start)
	if err != nil {
		return 0, err
	}
	took, added := time.Since(start), done()-done0
	after, err := st.tidbCount(ctx)
	if err != nil {
		return 0, err
	}
	purged := before - after + int64(added)
	fmt.Printf("%s: %s (%s): purged %d records in %v (%.0f rows/s), workers %.0f tx/s\n", st.dialect.Name(), what, ended, purged,
		took.Round(time.Second), float64(purged)/took.Seconds(), float64(added)/took.Seconds())
	return purged, nil
}

// tidbCount counts the table's records.
func (st *scaleTable) tidbCount(ctx context.Context) (int64, error) {
	var n int64
	err := st.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+st.store.Table()).Scan(&n)
	return n, err
}

// tidbTTL is tidbPhase's ttl, from start: it gives the table the TTL
// attribute and waits for a job that began after start to finish, for
// cfg.purgeFor at most (TiDB's job history has a job's deleted rows only
// once it finishes, so counted counts them).
func (st *scaleTable) tidbTTL(ctx context.Context, cfg scaleConfig, start time.Time) (string, error) {
	table := st.store.Table()
	if _, err := st.db.ExecContext(ctx, "ALTER TABLE "+table+" TTL = `expires_at` + INTERVAL 0 SECOND TTL_ENABLE = 'ON' TTL_JOB_INTERVAL = '1m'"); err != nil {
		return "", err
	}
	defer func() { _, _ = st.db.ExecContext(context.WithoutCancel(ctx), "ALTER TABLE "+table+" REMOVE TTL") }()
	// The job history's times are the server's (UTC here), in seconds.
	since := start.UTC().Truncate(time.Second).Format(time.DateTime)
	for cfg.purgeFor == 0 || time.Since(start) < cfg.purgeFor {
		var finished int64
		if err := st.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM mysql.tidb_ttl_job_history
WHERE table_schema = DATABASE() AND table_name = ? AND create_time >= ? AND status = 'finished'`, table, since).Scan(&finished); err != nil {
			return "", err
		}
		if finished > 0 {
			return "finished", nil
		}
		time.Sleep(time.Second)
	}
	return "did not finish within IDEM_SCALE_PURGE_FOR", nil
}
