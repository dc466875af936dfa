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
	)
	fs := newFlags("reseal", "--dsn DSN --keys-file FILE [--current ID] [--table NAME] [--batch 500]",
		"Rewrites the stored responses that are not sealed with the current key:\n"+
			"those of older keys after a rotation, and those stored in the clear\n"+
			"before the application had a sealer. Each batch is read, opened, sealed\n"+
			"anew and written back in a short transaction of its own, beside live\n"+
			"traffic. Make the new key current in the\n"+
			"application first (every process seals with it and still opens the\n"+
			"old ones), then reseal, then drop the old key from the application's\n"+
			"keys. A record that cannot be opened (a key the file lacks, a tampered\n"+
			"row) stops it, naming the record and the key.", stderr)
	f.register(fs)
	seal.register(fs, "the key ID to seal with (default: the file's last key)")
	fs.IntVar(&batch, "batch", 500, "records rewritten per batch")
	if err := parse(fs, args); err != nil {
		return err
	}
	if seal.keysFile == "" {
		return usageErr("reseal: --keys-file is required")
	}
	if batch <= 0 {
		return usageErr("reseal: --batch must be positive, got %d", batch)
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
	start := time.Now()
	n, err := s.Reseal(ctx, db, batch)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "resealed %s of %s in %s\n", plural(n, "record"), s.Table(), time.Since(start).Round(time.Millisecond))
	return nil
}
