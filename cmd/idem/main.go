// Command idem demonstrates idem and operates its table.
//
//	idem demo                      act out the failures idem prevents (embedded SQLite, no server)
//	idem migrate --dsn DSN         create the table, or upgrade it to the newest layout
//	idem inspect --dsn DSN --key K [--scope S]
//	                               a key's record in scope S, or (a scan) in every scope
//	idem stats   --dsn DSN         counts, oldest record, expired, size
//	idem purge   --dsn DSN         delete records past their expiry (tombstones under a key memory)
//	idem reseal  --dsn DSN --keys-file FILE
//	                               seal stored responses with the current key
//	idem bench   --dsn DSN         measure idem against a bare transaction
//
// DSNs: postgres://..., postgresql://..., mysql://user:pass@host:port/db?params,
// mariadb://..., tidb://..., sqlite:path or file:path (package dburl). Run
// "idem help COMMAND" for a command's flags.
// Exit codes: 0 success, 1 the command ran and found a failure (a broken
// invariant, a missing record), 2 bad usage or no usable database.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/dburl"
)

// command is a subcommand: its name, a one-line summary, and how to run it.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands is the table main dispatches on; a new subcommand is one line.
var commands = []command{
	{"demo", "act out the failures idem prevents, beside a naive response cache", runDemo},
	{"migrate", "create the idempotency table if it is absent, or upgrade it in place", runMigrate},
	{"inspect", "show a key's records as a person reads them, in one scope or all", runInspect},
	{"stats", "count records by status, oldest, expired, table size", runStats},
	{"purge", "delete records past their expiry, in batches (tombstones under a key memory)", runPurge},
	{"reseal", "seal the stored responses anew with the current key, in batches", runReseal},
	{"bench", "measure idem against a bare transaction on a server", runBench},
}

// exitError carries an exit code; main prints its message on one line.
type exitError struct {
	code  int
	err   error
	quiet bool // already reported (the flag package prints its own errors)
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErr is exit code 2: bad flags, bad DSN, no database.
func usageErr(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

// failure is exit code 1: the command ran and found something wrong.
func failure(format string, args ...any) error {
	return &exitError{code: 1, err: fmt.Errorf(format, args...)}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args to a subcommand and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			usage(stdout)
			return 0
		}
		name, rest = rest[0], []string{"--help"}
	}
	red := &redactor{}
	for _, c := range commands {
		if c.name == name {
			return exitCode(c.run(withRedactor(ctx, red), rest, stdout, stderr), stderr, red)
		}
	}
	fmt.Fprintf(stderr, "idem: unknown command %q; run \"idem help\" for the list\n", name)
	return 2
}

// exitCode prints err on one line, with what to do about it (an
// *idem.Error's Hint, which is not in its message), every secret red
// knows scrubbed, and returns the exit code it carries.
func exitCode(err error, stderr io.Writer, red *redactor) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var e *exitError
	if !errors.As(err, &e) {
		e = &exitError{code: 1, err: err}
	}
	if !e.quiet {
		msg := err.Error()
		if ie, ok := errors.AsType[*idem.Error](err); ok && ie.Hint != "" {
			msg += "; " + ie.Hint
		}
		fmt.Fprintln(stderr, "idem: "+strings.TrimPrefix(oneLine(red.scrub(msg)), "idem: "))
	}
	return e.code
}

// oneLine folds a driver's multi-line message into one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// plural is n and noun, with an s unless n is 1.
func plural[N int | int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "idem makes non-idempotent operations safe to retry. Usage:")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "  idem COMMAND [flags]")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run \"idem help COMMAND\" or \"idem COMMAND --help\" for its flags.")
	fmt.Fprintln(w, "DSNs: "+dburl.Forms+".")
}

// newFlags makes a subcommand's flag set, with a usage text that leads
// with what the command does.
func newFlags(name, synopsis, about string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: idem %s %s\n\n%s\n\nFlags:\n", name, synopsis, about)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses a subcommand's flags; a bad flag is exit code 2, and
// positional arguments are refused.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &exitError{code: 2, err: err, quiet: true}
	}
	if fs.NArg() > 0 {
		// Not quoted: the likeliest stray argument is a DSN given without --dsn.
		return usageErr("%s: %d unexpected argument(s) after the flags, not shown (one may be a DSN with a password); give the database with --dsn (see idem %s --help)", fs.Name(), fs.NArg(), fs.Name())
	}
	return nil
}
