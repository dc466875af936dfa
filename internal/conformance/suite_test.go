package conformance

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"strings"
	"testing"
)

// Every Test function of the package is in suite, so that none is
// written and never run.
func TestSuiteListsEveryTest(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, 0)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, s := range suite {
		listed[s.name] = true
	}
	for _, pkg := range pkgs {
		for _, f := range pkg.Files {
			for _, d := range f.Decls {
				if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") && !listed[fn.Name.Name] {
					t.Errorf("%s is not in suite: it never runs", fn.Name.Name)
				}
			}
		}
	}
}
