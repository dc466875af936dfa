// Command apidump prints the exported API of one module of the
// repository, one sorted line per feature, for scripts/api.sh:
//
//	go run ./scripts/apidump contrib/idemgin
//
// It reads the module path from the directory's go.mod and walks its
// package directories, skipping nested modules, testdata, vendor,
// internal, and directories whose name starts with "." or "_". For each
// non-main package (its non-test files, as built for linux/amd64 without
// cgo) it prints a "pkg PATH" line, then its exported consts, vars,
// funcs, types with their exported fields and methods, without doc
// comments or parameter names:
//
//	pkg github.com/idemkit/idem, func New(Dialect, ...Option) (*Store, error)
//	pkg github.com/idemkit/idem, method (*Store) Do(context.Context, DBTX, Request, func(context.Context) (Response, error)) (Result, error)
//	pkg github.com/idemkit/idem, type Request struct, Key string
package main

import (
	"bufio"
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/doc"
	"go/parser"
	"go/token"
	"go/types"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./scripts/apidump MODULE-DIR")
		os.Exit(2)
	}
	lines, err := module(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "apidump:", err)
		os.Exit(1)
	}
	sort.Strings(lines)
	w := bufio.NewWriter(os.Stdout)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
	if err := w.Flush(); err != nil {
		fmt.Fprintln(os.Stderr, "apidump:", err)
		os.Exit(1)
	}
}

// module returns the API lines of every package of the module in root.
func module(root string) ([]string, error) {
	modPath, err := modulePath(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	ctx := build.Default
	ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled = "linux", "amd64", false
	var lines []string
	err = filepath.WalkDir(root, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			return err
		}
		if rel != "." {
			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
				name == "testdata" || name == "vendor" || name == "internal" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				return filepath.SkipDir // a nested module
			}
		}
		bp, err := ctx.ImportDir(dir, 0)
		var noGo *build.NoGoError
		if errors.As(err, &noGo) || (err == nil && (len(bp.GoFiles) == 0 || bp.Name == "main")) {
			return nil // no package, a test-only package or a command
		}
		if err != nil {
			return err
		}
		pkgLines, err := pkg(dir, path.Join(modPath, filepath.ToSlash(rel)), bp.GoFiles)
		lines = append(lines, pkgLines...)
		return err
	})
	return lines, err
}

// modulePath returns the module path declared in the go.mod file gomod.
func modulePath(gomod string) (string, error) {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		line, _, _ = strings.Cut(line, "//")
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			if p, err := strconv.Unquote(f[1]); err == nil {
				return p, nil
			}
			return f[1], nil
		}
	}
	return "", fmt.Errorf("%s: no module line", gomod)
}

// pkg returns the API lines of the package in dir made of files.
func pkg(dir, importPath string, files []string) ([]string, error) {
	fset := token.NewFileSet()
	var asts []*ast.File
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		asts = append(asts, f)
	}
	consts := constValues(asts) // before go/doc drops the unexported specs
	p, err := doc.NewFromFiles(fset, asts, importPath)
	if err != nil {
		return nil, err
	}
	prefix := "pkg " + importPath
	lines := []string{prefix}
	add := func(format string, args ...any) {
		lines = append(lines, prefix+", "+fmt.Sprintf(format, args...))
	}
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			for _, spec := range v.Decl.Specs {
				s := spec.(*ast.ValueSpec)
				for i, name := range s.Names {
					if !name.IsExported() {
						continue
					}
					if v.Decl.Tok == token.CONST {
						add("const %s%s", name.Name, consts[name])
					} else {
						add("var %s%s", name.Name, varType(s, i))
					}
				}
			}
		}
	}
	funcs := func(fs []*doc.Func) {
		for _, f := range fs {
			if f.Recv == "" {
				add("func %s%s%s", f.Name, typeParams(f.Decl.Type.TypeParams), signature(f.Decl.Type))
			} else {
				add("method (%s) %s%s", f.Recv, f.Name, signature(f.Decl.Type))
			}
		}
	}
	values(p.Consts)
	values(p.Vars)
	funcs(p.Funcs)
	for _, t := range p.Types {
		values(t.Consts)
		values(t.Vars)
		funcs(t.Funcs)
		funcs(t.Methods)
		for _, spec := range t.Decl.Specs {
			typeLines(spec.(*ast.TypeSpec), add)
		}
	}
	return lines, nil
}

// constValues returns, for each const name, its type and value as
// declared, with implicit repetitions in a group made explicit and the
// value of iota noted where it is used.
func constValues(files []*ast.File) map[*ast.Ident]string {
	out := map[*ast.Ident]string{}
	for _, f := range files {
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			var typ ast.Expr
			var vals []ast.Expr
			for iotaValue, spec := range g.Specs {
				s := spec.(*ast.ValueSpec)
				if s.Type != nil || len(s.Values) > 0 {
					typ, vals = s.Type, s.Values
				}
				for i, name := range s.Names {
					var b strings.Builder
					if typ != nil {
						b.WriteString(" " + types.ExprString(typ))
					}
					if i < len(vals) {
						v := types.ExprString(vals[i])
						b.WriteString(" = " + v)
						if usesIota(vals[i]) {
							fmt.Fprintf(&b, " // iota = %d", iotaValue)
						}
					}
					out[name] = b.String()
				}
			}
		}
	}
	return out
}

func usesIota(e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok && id.Name == "iota" {
			found = true
		}
		return !found
	})
	return found
}

// varType returns " T" for a var declared with a type, else " = " and
// its value, a call's arguments elided.
func varType(s *ast.ValueSpec, i int) string {
	if s.Type != nil {
		return " " + types.ExprString(s.Type)
	}
	v := s.Values[min(i, len(s.Values)-1)]
	if call, ok := v.(*ast.CallExpr); ok {
		return " = " + types.ExprString(call.Fun) + "(…)"
	}
	return " = " + types.ExprString(v)
}

// typeLines adds the lines of one exported type: its kind or
// definition, then a struct's exported fields or an interface's
// methods and embedded types, one a line.
func typeLines(s *ast.TypeSpec, add func(string, ...any)) {
	head := "type " + s.Name.Name + typeParams(s.TypeParams)
	if s.Assign.IsValid() {
		add("%s = %s", head, expr(s.Type))
		return
	}
	switch t := s.Type.(type) {
	case *ast.StructType:
		add("%s struct", head)
		fieldLines(head+" struct", t.Fields, false, add)
		if t.Incomplete {
			add("%s struct, unexported fields", head)
		}
	case *ast.InterfaceType:
		add("%s interface", head)
		fieldLines(head+" interface", t.Methods, true, add)
		if t.Incomplete {
			add("%s interface, unexported methods", head)
		}
	default:
		add("%s %s", head, expr(t))
	}
}

// fieldLines adds a line per struct field, or per interface method.
func fieldLines(head string, fields *ast.FieldList, methods bool, add func(string, ...any)) {
	for _, f := range fields.List {
		if len(f.Names) == 0 {
			add("%s, embedded %s", head, expr(f.Type))
			continue
		}
		for _, name := range f.Names {
			if methods {
				add("%s, %s%s", head, name.Name, signature(f.Type.(*ast.FuncType)))
			} else {
				add("%s, %s %s", head, name.Name, expr(f.Type))
			}
		}
	}
}

// typeParams returns "[T any, ...]", or "" for no type parameters.
func typeParams(fl *ast.FieldList) string {
	if fl == nil || len(fl.List) == 0 {
		return ""
	}
	var ps []string
	for _, f := range fl.List {
		var names []string
		for _, n := range f.Names {
			names = append(names, n.Name)
		}
		ps = append(ps, strings.Join(names, ", ")+" "+expr(f.Type))
	}
	return "[" + strings.Join(ps, ", ") + "]"
}

// signature returns a func type's parameters and results without their
// names: "(context.Context, Request) (Result, error)".
func signature(ft *ast.FuncType) string {
	return strings.TrimPrefix(expr(&ast.FuncType{Params: ft.Params, Results: ft.Results}), "func")
}

// expr prints e on one line, without the names of the parameters and
// results of the func types in it.
func expr(e ast.Expr) string {
	ast.Inspect(e, func(n ast.Node) bool {
		if ft, ok := n.(*ast.FuncType); ok {
			ft.Params, ft.Results = unnamed(ft.Params), unnamed(ft.Results)
		}
		return true
	})
	return types.ExprString(e)
}

func unnamed(fl *ast.FieldList) *ast.FieldList {
	if fl == nil {
		return nil
	}
	out := &ast.FieldList{}
	for _, f := range fl.List {
		for range max(len(f.Names), 1) {
			out.List = append(out.List, &ast.Field{Type: f.Type})
		}
	}
	return out
}
