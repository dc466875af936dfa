// Package conformance is idem's conformance suite.
package conformance
