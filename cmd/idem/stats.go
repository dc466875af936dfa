package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem"
)

func runStats(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		f         dbFlags
		retention time.Duration
		asJSON    bool
	)
	fs := newFlags("stats", "--dsn DSN [--table NAME] [--retention 24h] [--json]",
		"Counts the records by status, shows the oldest, how many are past their own\nexpiry (each record's, set when it was written) but not yet purged, and the\ntable's and indexes' size where the database can tell. Reads only.", stderr)
	f.register(fs)
	fs.DurationVar(&retention, "retention", idem.DefaultRetention, "the application's retention: only for the records of a release before per-request retention, which have no expiry of their own")
	fs.BoolVar(&asJSON, "json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	db, t, s, err := f.open(ctx, false, idem.WithRetention(retention))
	if err != nil {
		return err
	}
	defer db.Close()
	st, err := s.Stats(ctx, db)
	if err != nil {
		return err
	}
	if asJSON {
		j := statsJSON{
			Table: s.Table(), Dialect: t.Dialect.Name(), Total: st.Total, ByStatus: st.ByStatus,
			PastExpiry: st.Expired, RetentionSeconds: retention.Seconds(),
		}
		for _, status := range []idem.Status{idem.StatusProcessing, idem.StatusCompleted, idem.StatusReleased, idem.StatusExpired} {
			if _, ok := j.ByStatus[status]; !ok {
				j.ByStatus[status] = 0
			}
		}
		if !st.Oldest.IsZero() {
			j.Oldest = &st.Oldest
			age := st.Now.Sub(st.Oldest).Seconds()
			j.OldestAgeSeconds = &age
		}
		if st.TableBytes >= 0 {
			j.TableBytes = &st.TableBytes
		}
		if st.IndexBytes >= 0 {
			j.IndexBytes = &st.IndexBytes
		}
		return writeJSON(stdout, j)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "table\t%s (%s)\n", s.Table(), t.Where)
	fmt.Fprintf(tw, "records\t%d\n", st.Total)
	for _, status := range slices.Sorted(maps.Keys(st.ByStatus)) {
		fmt.Fprintf(tw, "  %s\t%d\n", status, st.ByStatus[status])
	}
	if st.Oldest.IsZero() {
		fmt.Fprintf(tw, "oldest\t-\n")
	} else {
		fmt.Fprintf(tw, "oldest\t%s (age %s)\n", stamp(st.Oldest), ago(st.Now.Sub(st.Oldest)))
	}
	fmt.Fprintf(tw, "past expiry\t%d (by each record's own expiry; not yet purged)\n", st.Expired)
	fmt.Fprintf(tw, "table size\t%s\n", bytesOrUnknown(st.TableBytes))
	fmt.Fprintf(tw, "index size\t%s\n", bytesOrUnknown(st.IndexBytes))
	return tw.Flush()
}

type statsJSON struct {
	Table            string                `json:"table"`
	Dialect          string                `json:"dialect"`
	Total            int64                 `json:"total"`
	ByStatus         map[idem.Status]int64 `json:"by_status"`
	Oldest           *time.Time            `json:"oldest"`
	OldestAgeSeconds *float64              `json:"oldest_age_seconds"`
	PastExpiry       int64                 `json:"past_expiry"` // past each record's own expiry, not yet purged
	RetentionSeconds float64               `json:"retention_seconds"`
	TableBytes       *int64                `json:"table_bytes"` // null where the database cannot tell
	IndexBytes       *int64                `json:"index_bytes"`
}

func bytesOrUnknown(n int64) string {
	switch {
	case n < 0:
		return "unknown"
	case n < 1024:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/1024)
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
