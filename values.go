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
func (s *statements) query(st Statement, v *values) Query {
	if len(st.Args) == 0 {
		return Query{SQL: st.SQL}
	}
	args := make([]any, len(st.Args))
	for i, a := range st.Args {
		switch a {
		case ArgScope:
			args[i] = v.req.Scope
		case ArgKey:
			args[i] = v.req.Key
		case ArgOperation:
			args[i] = v.req.Operation
		case ArgFingerprint:
			args[i] = v.req.Fingerprint
		case ArgToken:
			args[i] = v.token
		case ArgLease:
			args[i] = v.lease
		case ArgRetention:
			args[i] = v.retention
		case ArgKeep:
			args[i] = v.keep
		case ArgExpiry:
			args[i] = v.expiry
		case ArgKeyMemory:
			args[i] = v.keyMemory
		case ArgMemory:
			args[i] = v.memory
		case ArgSealedKey:
			args[i] = v.sealedKey
		case ArgStatus:
			args[i] = v.resp.StatusCode
		case ArgHeader:
			args[i] = v.header
		case ArgBody:
			args[i] = v.body
		case ArgRef:
			args[i] = v.ref
		case ArgFrom:
			args[i] = v.from
		case ArgUpto:
			args[i] = v.upto
		case ArgTo:
			args[i] = v.to
		case ArgLimit:
			args[i] = v.limit
		case ArgSchema:
			args[i] = s.schema()
		case ArgBase:
			args[i] = s.base()
		case ArgQuoted:
			args[i] = s.Quoted
		case ArgIndex:
			args[i] = s.base() + "_expires_at_idx"
		case ArgIndexName:
			args[i] = v.indexName
		}
	}
	return Query{SQL: st.SQL, Args: args}
}

// micros is d in whole microseconds, rounded up: how durations are sent to
// the database. MaxDuration keeps it from overflowing.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
