package idem

import "time"

// values are what the engine binds a statement's arguments to.
type values struct {
	req                                        Request
	token, lease, retention, expiry, keyMemory int64
	memory                                     int64
	keep                                       any // int64, or nil
	from, upto, to                             int64
	limit                                      int
	resp                                       Response
	header, body                               []byte
	sealedKey                                  any
	ref                                        any // []byte, or nil
	indexName                                  string
	// passed is set by a purge batch that passed over rows another
	// transaction held.
	passed bool
}

// query binds st's arguments to v, for the Store's table.
func (s *statements) query(st statement, v *values) Query {
	if len(st.args) == 0 {
		return Query{SQL: st.sql}
	}
	args := make([]any, len(st.args))
	for i, a := range st.args {
		switch a {
		case argScope:
			args[i] = v.req.Scope
		case argKey:
			args[i] = v.req.Key
		case argOperation:
			args[i] = v.req.Operation
		case argFingerprint:
			args[i] = v.req.Fingerprint
		case argToken:
			args[i] = v.token
		case argLease:
			args[i] = v.lease
		case argRetention:
			args[i] = v.retention
		case argKeep:
			args[i] = v.keep
		case argExpiry:
			args[i] = v.expiry
		case argKeyMemory:
			args[i] = v.keyMemory
		case argMemory:
			args[i] = v.memory
		case argSealedKey:
			args[i] = v.sealedKey
		case argStatus:
			args[i] = v.resp.StatusCode
		case argHeader:
			args[i] = v.header
		case argBody:
			args[i] = v.body
		case argRef:
			args[i] = v.ref
		case argFrom:
			args[i] = v.from
		case argUpto:
			args[i] = v.upto
		case argTo:
			args[i] = v.to
		case argLimit:
			args[i] = v.limit
		case argSchema:
			args[i] = s.table.schema()
		case argBase:
			args[i] = s.table.base()
		case argQuoted:
			args[i] = s.table.quoted
		case argIndex:
			args[i] = s.table.base() + "_expires_at_idx"
		case argIndexName:
			args[i] = v.indexName
		}
	}
	return Query{SQL: st.sql, Args: args}
}

// micros is d in whole microseconds, rounded up: how durations are sent to
// the database. MaxDuration keeps it from overflowing.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
