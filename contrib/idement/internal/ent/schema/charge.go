// Package schema is the ent schema of idement's tests and examples: one
// charge per business row, named by the request's key.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/dialect/entsql"
	"entgo.io/ent/schema"
	"entgo.io/ent/schema/field"
	"entgo.io/ent/schema/index"
)

// Charge holds the schema definition for the Charge entity.
type Charge struct {
	ent.Schema
}

// Annotations of the Charge: a table name of idement's own, since the
// examples run on a database the other tests share.
func (Charge) Annotations() []schema.Annotation {
	return []schema.Annotation{entsql.Annotation{Table: "idement_charges"}}
}

// Fields of the Charge.
func (Charge) Fields() []ent.Field {
	return []ent.Field{
		field.String("ref").MaxLen(255),
		field.Int64("amount"),
	}
}

// Indexes of the Charge.
func (Charge) Indexes() []ent.Index {
	return []ent.Index{
		index.Fields("ref"),
	}
}
