-- name: InsertCharge :execlastid
INSERT INTO charges (ref, amount) VALUES (?, ?);

-- name: CountCharges :one
SELECT COUNT(*) FROM charges WHERE ref = ?;
