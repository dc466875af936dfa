package idem

import (
	"context"
	"hash/maphash"
	"sync/atomic"
)

// retryHintKey is the context key of WithRetryHint.
type retryHintKey struct{}

// WithRetryHint returns a copy of ctx that tells [Store.Do] and
// [Store.Begin] that the request is one its client has sent before: a
// retry, which has most likely been served already, by this process or
// by another instance of the service. They then read the key's record
// before they claim the key, as they do for a key the [Store] has served
// itself, so that the replay of a key that another instance completed is
// one read instead of a claim statement that finds the record and then a
// read (on MySQL's schema version 2 that claim writes a row and undoes
// it, which costs the commit a flush of the log).
//
// It is a hint, never trusted: the read decides, and whatever it finds
// other than a completed record within retention (no record, a claim in
// flight, a record past retention) goes on to the claim as without the
// hint, so a wrong hint costs one read and changes no outcome. A layer
// that knows it is resending marks the request: idemclient's Transport
// sends each retry with an Idempotency-Attempt header, which the HTTP
// middleware turns into this hint.
func WithRetryHint(ctx context.Context) context.Context {
	return context.WithValue(ctx, retryHintKey{}, true)
}

// retryHinted reports whether ctx carries WithRetryHint.
func retryHinted(ctx context.Context) bool {
	hinted, _ := ctx.Value(retryHintKey{}).(bool)
	return hinted
}

// completedSlots is how many keys a Store's completed remembers: 128 KiB
// of hashes.
const completedSlots = 1 << 14

// completedSeed seeds the hashes of every Store in the process.
var completedSeed = maphash.MakeSeed()

// completedKeys remembers, by a hash of scope and key, keys whose record this
// Store has seen completed: it stored their response (in Do or through a
// Claim) or replayed it. acquire reads such a key's record before it
// claims the key, so that a replay of a key this process has served is
// one read instead of a claim statement that finds the record and then a
// read (and on MySQL's schema version 2 that claim writes a row and undoes
// it, which costs the commit a flush of the log). It is a hint, never
// trusted: the read decides, and whatever it finds other than a completed
// record within retention goes the usual way, so a hash that collides, or
// a key whose completion was rolled back or has since passed retention,
// costs one read more. A key this process has not served, or one evicted
// by a later key, goes the usual way at no extra cost, unless most such
// keys lately were replays (share): then, where the dialect's read of a
// missing key locks nothing, it is read first too. A slot holds the hash
// of the last key put there; 0 is empty.
type completedKeys struct {
	slots [completedSlots]atomic.Uint64
	// share is the part of the keys acquire did not know (neither in
	// slots nor hinted as retries) whose record it found completed and
	// replayed, a moving average over about the last shareWindow of them,
	// in units of shareOne.
	share atomic.Int64
}

// shareOne is a share of 1 in completed.share; shareWindow is how many
// of the latest keys the share weighs, as a power of two.
const (
	shareOne    = 1 << 16
	shareWindow = 6 // 64 keys
)

// saw counts a key acquire did not know: replayed, when its record was
// found completed and replayed.
func (c *completedKeys) saw(replayed bool) {
	target := int64(0)
	if replayed {
		target = shareOne
	}
	for {
		old := c.share.Load()
		if c.share.CompareAndSwap(old, old+(target-old)>>shareWindow) {
			return
		}
	}
}

// replaysMostly reports whether most of the latest keys acquire did not
// know were replays: a retry storm, a client that retries without saying
// so, replays reaching an instance that did not serve them. acquire then
// reads such a key first, as a hinted one, where a read of a key that
// has no record costs one statement and locks nothing.
func (c *completedKeys) replaysMostly() bool {
	return c.share.Load() > shareOne/2
}

// keyHash is the hint's name for the key (scope, key): never 0.
func keyHash(scope, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(completedSeed)
	_, _ = h.WriteString(scope)
	_ = h.WriteByte(0)
	_, _ = h.WriteString(key)
	return h.Sum64() | 1
}

// add remembers that the key (scope, key) is completed.
func (c *completedKeys) add(scope, key string) {
	h := keyHash(scope, key)
	c.slots[h%completedSlots].Store(h)
}

// has reports whether the key (scope, key) may be completed.
func (c *completedKeys) has(scope, key string) bool {
	h := keyHash(scope, key)
	return c.slots[h%completedSlots].Load() == h
}
