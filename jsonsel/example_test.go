package jsonsel_test

import (
	"fmt"
	"log"

	"github.com/idemkit/idem/jsonsel"
)

// A producer computes what counts of its message the way the consumer
// does: the counted fields, in canonical form, whatever the order of
// members and the volatile ones.
func ExampleSelection_Select() {
	sel, err := jsonsel.New([]string{"/amount", "/currency"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, doc := range []string{
		`{"amount": 100, "currency": "eur", "sent_at": "12:00:00"}`,
		`{"sent_at": "12:00:05", "currency": "eur", "amount": 100, "retry": 1}`,
		`{"currency": "eur"}`,
	} {
		out, err := sel.Select([]byte(doc))
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(string(out))
	}
	fmt.Println(sel.Version())
	// Output:
	// {"/amount":100,"/currency":"eur"}
	// {"/amount":100,"/currency":"eur"}
	// {"/currency":"eur"}
	// json-4f4a4d2cbc1c8e2d
}
