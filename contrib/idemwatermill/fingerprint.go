package idemwatermill

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/jsonsel"
)

// fingerprinter is what of a message counts: the payload or a selection
// of it, and the named metadata fields.
type fingerprinter struct {
	sel      *jsonsel.Selection // nil: the whole payload, byte for byte
	metadata []string
	version  string // "" without a selection
}

func (cfg Config) fingerprinter() (fingerprinter, error) {
	f := fingerprinter{metadata: cfg.Fingerprint}
	if len(cfg.PayloadFields) == 0 && len(cfg.PayloadIgnore) == 0 {
		return f, nil
	}
	sel, err := jsonsel.New(cfg.PayloadFields, cfg.PayloadIgnore)
	if err != nil {
		return f, fmt.Errorf("idemwatermill: Config.PayloadFields or PayloadIgnore: %w", err)
	}
	f.sel = sel
	parts := [][]byte{[]byte("payload"), []byte(sel.Version()), []byte("metadata")}
	for _, name := range cfg.Fingerprint {
		parts = append(parts, []byte(name))
	}
	f.version = "msg-" + idem.Fingerprint(parts...)[:16]
	return f, nil
}

// of returns msg's fingerprint, or an error wrapping
// idem.ErrInvalidRequest when the selection cannot read its payload.
func (f fingerprinter) of(msg *message.Message) (string, error) {
	payload := []byte(msg.Payload)
	if f.sel != nil {
		sel, err := f.sel.Select(payload)
		if err != nil {
			return "", fmt.Errorf("%w: message %s: Config.PayloadFields or PayloadIgnore select fields of a JSON payload, and cannot: %w", idem.ErrInvalidRequest, msg.UUID, err)
		}
		payload = sel
	}
	parts := make([][]byte, 0, 1+2*len(f.metadata))
	parts = append(parts, payload)
	for _, name := range f.metadata {
		parts = append(parts, []byte(name), []byte(msg.Metadata.Get(name)))
	}
	if f.version == "" {
		return idem.Fingerprint(parts...), nil
	}
	return idem.VersionedFingerprint(f.version, parts...), nil
}

// FingerprintOf returns the fingerprint the middleware of cfg records
// for msg, as [Config].Fingerprint describes it: what a producer, or a
// tool that looks a message's record up (idem inspect), computes to
// compare. Only cfg's Fingerprint, PayloadFields and PayloadIgnore
// matter. An error says cfg's selection is not valid, or wraps
// [idem.ErrInvalidRequest] when it cannot read msg's payload.
func FingerprintOf(cfg Config, msg *message.Message) (string, error) {
	f, err := cfg.fingerprinter()
	if err != nil {
		return "", err
	}
	return f.of(msg)
}
