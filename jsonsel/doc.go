// Package jsonsel chooses what of a JSON document counts in an
// idempotency fingerprint: the members named by JSON Pointers (RFC 6901)
// that count, or those that are ignored, in a canonical form in which the
// order of object members and insignificant whitespace never matter.
// idemhttp uses it for request bodies and the consumer middleware for
// message payloads; a producer or a client that must compute the same
// fingerprint can use it too.
//
// # Canonical form
//
// [Canonical] writes a JSON text without insignificant whitespace and
// with the members of every object sorted by name. Strings and numbers
// are kept exactly as written: 1.0 and 1 differ, a big integer keeps
// every digit, "\u0041" differs from "A". So two documents share a
// canonical form only if they differ in whitespace and in an order of
// members that no decoder reads differently. Members are sorted by their
// name as encoding/json reads it (unescaped and case-folded); members
// whose names are the same in that sense keep the order they were
// written in, because that order decides which one a decoder keeps.
// This is not RFC 8785 (JCS), which rewrites numbers as IEEE 754 doubles
// and so would give an amount of 100000000000000000001 and one of
// 100000000000000000000 one fingerprint.
//
// # Selection
//
// A [Selection] made by [New] from Fields (the pointers that count) and
// Ignore (the pointers that do not) maps a document to the canonical
// form of what counts:
//
//   - the members Ignore names are removed first, wherever they are; an
//     ignored array element keeps its place, written as nothing, so that
//     the others keep their indexes: [1,2] less "/0" counts as [,2];
//   - with Fields, what counts is a JSON object whose member names are
//     the pointers of Fields, in increasing byte order, each with the
//     canonical form of the value it points at; a pointer that points at
//     nothing (an absent member, an index past an array's end, a step
//     into a string or number) is left out, so an absent field counts as
//     absent, which differs from any value, null included;
//   - without Fields, what counts is the canonical form of the whole
//     document, less what Ignore removed.
//
// A pointer's step into an object matches the members whose name equals
// it as encoding/json matches a struct field's, case-insensitively, so
// that a client cannot change a counted value by sending its name in
// other case. A document in which a step of a counted pointer matches
// two members is refused ([ErrAmbiguous]): which of them a decoder keeps
// is its own choice. An ignored pointer removes every member it matches.
// A step into an array is a decimal index without leading zeros; "-"
// points at nothing.
//
// The [Selection.Version] names the selection, so that a fingerprint made
// with one can be told from one made with another
// ([github.com/idemkit/idem.VersionedFingerprint]).
package jsonsel
