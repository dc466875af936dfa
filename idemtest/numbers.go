package idemtest

import "fmt"

// Numbers returns a FROM list and a sum over it that yield the integers
// 0..10^k-1, for the least k with 10^k >= n, from a cross join of digits:
// set-based and portable to MySQL 8, MariaDB and TiDB, unlike a sequence
// engine or a deep recursive CTE. [Records.MySQL] counts with it; a test
// that fills a table of its own on those databases can too:
//
//	from, sum := idemtest.Numbers(1000)
//	q := "INSERT INTO t (n) SELECT " + sum + " FROM " + from // 0..999
func Numbers(n int) (from, sum string) {
	for i, f := 0, 1; i == 0 || f < n; i, f = i+1, f*10 {
		if i > 0 {
			from += ", "
			sum += " + "
		}
		from += fmt.Sprintf("(SELECT 0 d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9) d%d", i)
		sum += fmt.Sprintf("%d*d%d.d", f, i)
	}
	return from, sum
}
