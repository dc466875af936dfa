package idem

import (
	"errors"
	"fmt"
)

// New returns a [Store] for the dialect, or an error that names the bad
// option (a table name that is not an identifier, a lease, retention or
// lock timeout out of bounds, an option the dialect does not support). A
// [Store] that New returns is usable: no later call reports its
// configuration.
func New(d Dialect, opts ...Option) (*Store, error) {
	s := &Store{dialect: d, table: DefaultTable, lease: DefaultLease, retention: DefaultRetention, completed: new(completedKeys), watches: new(standbyWatches)}
	for _, o := range opts {
		o(s)
	}
	if err := s.configure(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Store) configure() error {
	if s.dialect == nil {
		return errors.New("idem: New needs a Dialect (idem.Postgres, idem.MySQL, idem.MariaDB, idem.TiDB or idem.SQLite)")
	}
	if err := checkDuration("lease", s.lease); err != nil {
		return err
	}
	if err := checkDuration("retention", s.retention); err != nil {
		return err
	}
	if s.keyMemory != 0 {
		if err := checkDuration("key memory", s.keyMemory); err != nil {
			return err
		}
	}
	if s.hasLockWait {
		if s.lockWait <= 0 || s.lockWait > MaxLockTimeout {
			return fmt.Errorf("idem: lock timeout must be positive and at most %v, got %v", MaxLockTimeout, s.lockWait)
		}
		if s.dialect.lockWaiter() == nil {
			return fmt.Errorf("idem: WithLockTimeout is not supported by the %s dialect", s.dialect.Name())
		}
	}
	if s.hasSealer && s.sealer == nil {
		return errors.New("idem: WithSealer needs a Sealer, got nil")
	}
	if err := s.configureCache(); err != nil {
		return err
	}
	parts, err := parseTable(s.table)
	if err != nil {
		return err
	}
	s.st = s.dialect.statements(parts)
	s.st.Migrations = withRetention(s.st.Migrations, s.retention)
	return nil
}
