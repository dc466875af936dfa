package idem

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// BenchmarkCacheEntryMemory measures the heap a replay cache entry takes,
// with its strings, header and body (a 19-byte body, one header field),
// as B/entry, beside what MaxBytes counts of it (counted-B/entry):
//
//	go test -run '^$' -bench BenchmarkCacheEntryMemory .
func BenchmarkCacheEntryMemory(b *testing.B) {
	const n = 100_000
	for b.Loop() {
		c := &replayCache{cfg: ReplayCache{MaxEntries: n}}
		c.entries = make(map[string]*cacheEntry)
		c.root.prev, c.root.next = &c.root, &c.root
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		deadline := time.Now().Add(time.Hour)
		for i := range n {
			req := Request{Scope: "tenant-1", Key: fmt.Sprintf("key-%012d", i), Operation: "POST /v1/orders",
				Fingerprint: Fingerprint(fmt.Appendf(nil, "%d", i))}
			e := &cacheEntry{id: cacheID(req), operation: req.Operation, fingerprint: req.Fingerprint, deadline: deadline,
				resp: cloneResponse(Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"order":"created"}`)})}
			e.size = e.sizeOf()
			c.put(e)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		entries, counted := c.len()
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(entries), "B/entry")
		b.ReportMetric(float64(counted)/float64(entries), "counted-B/entry")
		runtime.KeepAlive(c)
	}
}
