package conformance

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unicode"
)

// Every test function of the package (named test and a capital) is in
// suite, under its name with a capital T, so that none is written and
// never run.
func TestSuiteListsEveryTest(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range suite {
		listed[s.name] = true
		if fn := runtime.FuncForPC(reflect.ValueOf(s.test).Pointer()).Name(); !strings.HasSuffix(fn, ".t"+strings.TrimPrefix(s.name, "T")) {
			t.Errorf("suite runs %s under the name %s", fn, s.name)
		}
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && isTest(fn.Name.Name) && !listed["T"+strings.TrimPrefix(fn.Name.Name, "t")] {
				t.Errorf("%s is not in suite: it never runs", fn.Name.Name)
			}
		}
	}
}

// isTest reports a test function's name: test and a capital.
func isTest(name string) bool {
	rest, ok := strings.CutPrefix(name, "test")
	return ok && rest != "" && unicode.IsUpper(rune(rest[0]))
}
