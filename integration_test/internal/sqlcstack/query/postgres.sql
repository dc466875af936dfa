-- name: InsertCharge :one
INSERT INTO charges (ref, amount) VALUES ($1, $2) RETURNING id;

-- name: CountCharges :one
SELECT count(*) FROM charges WHERE ref = $1;
