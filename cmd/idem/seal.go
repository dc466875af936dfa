package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// sealFlags are the flags that give a command the keys of the sealer the
// application seals its responses with (idem.WithSealer).
type sealFlags struct {
	keysFile string
	current  string
}

func (f *sealFlags) register(fs *flag.FlagSet, current string) {
	fs.StringVar(&f.keysFile, "keys-file", "", "a file of the sealer's keys, one per line: ID and the 32-byte key in hex or base64, separated by spaces; a line starting with # is a comment; the last key is current (docs/operations.md, Sealing)")
	if current != "" {
		fs.StringVar(&f.current, "current", "", current)
	}
}

// sealer is the AES-GCM sealer of the keys file (idem.ParseKeys reads
// it), sealing with the key named current (the file's last key when
// current is ""); nil without a keys file.
func (f *sealFlags) sealer(command string) (idem.Sealer, error) {
	if f.keysFile == "" {
		return nil, nil
	}
	file, err := os.Open(f.keysFile)
	if err != nil {
		return nil, usageErr("%s: --keys-file: %v", command, err)
	}
	defer file.Close()
	last, keys, err := idem.ParseKeys(file)
	if err != nil {
		return nil, usageErr("%s: --keys-file %s: %s", command, f.keysFile, strings.TrimPrefix(err.Error(), "idem: keys file: "))
	}
	current := f.current
	if current == "" {
		current = last
	}
	s, err := idem.NewAESGCMSealer(current, keys)
	if err != nil {
		return nil, usageErr("%s: %s", command, strings.TrimPrefix(err.Error(), "idem: "))
	}
	return s, nil
}

func runReseal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		f     dbFlags
		seal  sealFlags
		batch int
		every time.Duration
	)
	fs := newFlags("reseal", "--dsn DSN --keys-file FILE [--current ID] [--table NAME] [--batch 500] [--progress 1s]",
		"Rewrites the stored responses that are not sealed with the current key:\n"+
			"those of older keys after a rotation, and those stored in the clear\n"+
			"before the application had a sealer. Records past their expiry are\n"+
			"skipped: they no longer replay. Each batch is read, opened, sealed anew\n"+
			"and written back in a short transaction of its own, beside live\n"+
			"traffic; a progress line says what is done, the rate and what is left.\n"+
			"Make the new key current in the application first (every process seals\n"+
			"with it and still opens the old ones), then reseal, then drop the old\n"+
			"key from the application's keys. A record that cannot be opened (a key\n"+
			"the file lacks, a tampered row) stops it, naming the record and the key.\n"+
			"Stopped (Ctrl-C, SIGTERM, an error), it loses at most its current batch;\n"+
			"the same command run again goes on with what is left, since the records\n"+
			"done are sealed with the current key and are not read again.", stderr)
	f.register(fs)
	seal.register(fs, "the key ID to seal with (default: the file's last key)")
	fs.IntVar(&batch, "batch", 500, "records rewritten per batch")
	fs.DurationVar(&every, "progress", time.Second, "at most one progress line per this long; 0: one per batch")
	if err := parse(fs, args); err != nil {
		return err
	}
	if seal.keysFile == "" {
		return usageErr("reseal: --keys-file is required")
	}
	if batch <= 0 {
		return usageErr("reseal: --batch must be positive, got %d", batch)
	}
	if every < 0 {
		return usageErr("reseal: --progress must not be negative, got %v", every)
	}
	sealer, err := seal.sealer("reseal")
	if err != nil {
		return err
	}
	db, _, s, err := f.open(ctx, false, idem.WithSealer(sealer))
	if err != nil {
		return err
	}
	defer db.Close()
	current := sealer.(interface{ KeyID() string }).KeyID()
	left, err := s.ResealLeft(ctx, db)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s of %s to reseal with key %s (records past their expiry are skipped)\n", plural(left, "record"), s.Table(), current)
	var (
		start   = time.Now()
		shown   = start
		total   int64
		batches int
		at      idem.ResealCursor
	)
	for {
		n, next, err := s.ResealBatch(ctx, db, at, batch)
		total += n
		switch {
		case err != nil && ctx.Err() != nil:
			return failure("reseal stopped after resealing %s in %s; run the same command again to go on: the records done are sealed with %s and are not read again",
				plural(total, "record"), time.Since(start).Round(time.Millisecond), current)
		case err != nil:
			return fmt.Errorf("%w (after resealing %s; run it again to go on with the rest)", err, plural(total, "record"))
		}
		if n > 0 {
			batches++
		}
		if now := time.Now(); n > 0 && (now.Sub(shown) >= every || n < int64(batch)) {
			shown = now
			rate := float64(total) / max(now.Sub(start).Seconds(), 1e-3)
			fmt.Fprintf(stdout, "batch %d: resealed %d (%d so far, %.0f records/s, about %d left)\n", batches, n, total, rate, max(left-total, 0))
		}
		if n < int64(batch) {
			break
		}
		at = next
	}
	fmt.Fprintf(stdout, "resealed %s of %s in %s\n", plural(total, "record"), s.Table(), time.Since(start).Round(time.Millisecond))
	return nil
}
