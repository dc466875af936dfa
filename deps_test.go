package idem

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// repoModule is the root module's path; the layers below name packages
// by their path under it.
const repoModule = "github.com/idemkit/idem"

// layers places every package of every module of the repository, the
// lowest layer first. A package imports packages of lower layers and,
// in its own layer, only those of its own entry: an entry "x/..." is x
// and every package below it, and a "*" in one stands for one element,
// each value its own entry ("contrib/*/..." makes each module under
// contrib an entry of its own, which imports no other). Test files, of
// every package, stand above all the layers: they may import any
// package the list places. A package the list does not place, or an
// import of one, fails TestLayers: place it.
var layers = []struct {
	name     string
	packages []string
}{
	{"below the Store: the DDL files and the structured-field reader, which import nothing of idem", []string{"schema", "internal/sfv"}},
	{"the Store: the seam, database/sql's adapter and the dialects", []string{"."}},
	{"on the Store's API alone: fingerprint selections, OpenTelemetry, the serving core", []string{"jsonsel", "idemotel", "idemserve"}},
	{"pgx's adapter, which reads the serving core's transaction (idemserve.TxFrom)", []string{"idempgx"}},
	{"HTTP: the server's middleware and the client's transport", []string{"idemhttp", "idemclient"}},
	{"the command's parts: DSNs (with their drivers) and the benchmark", []string{"internal/dburl", "internal/bench"}},
	{"programs", []string{"cmd/...", "examples/...", "scripts/..."}},
	{"contrib: a module per ORM, router or protocol, on the public API", []string{"contrib/*/..."}},
	{"the test kit", []string{"idemtest/..."}},
	{"the tests on servers", []string{"integration_test/..."}},
}

// Database drivers, by the path of their packages.
const (
	mysqlDriver  = "github.com/go-sql-driver/mysql"
	pgxDriver    = "github.com/jackc/pgx"
	pqDriver     = "github.com/lib/pq"
	sqliteDriver = "modernc.org/sqlite"
)

var drivers = []string{mysqlDriver, pgxDriver, pqDriver, sqliteDriver}

// driverLinks names every package that may link a database driver
// (import it, directly or through other packages: go list -deps), and
// which;
// every other package links none. The root package above all: a driver
// it imported would be linked into every program that uses idem, and
// register its driver name ("mysql", "postgres", "pgx", "sqlite") there,
// which panics beside another driver, or a test's mock, that registers
// the same name. The dialects read driver errors by their methods or by
// reflection instead. Entries are matched as in layers.
var driverLinks = []struct {
	packages string
	drivers  []string
}{
	{"idempgx", []string{pgxDriver}},                                      // pgx's adapter
	{"internal/dburl", []string{mysqlDriver, pgxDriver, sqliteDriver}},    // opens the DSNs it parses
	{"cmd/...", []string{mysqlDriver, pgxDriver, pqDriver, sqliteDriver}}, // dburl's, and lib/pq for idem bench -driver postgres
	{"examples/...", []string{mysqlDriver, pgxDriver, sqliteDriver}},      // dburl's
	{"contrib/idemwatermill/...", []string{pgxDriver, pqDriver}},          // pgx for its outbox; watermill-sql imports lib/pq
	{"idemtest/...", []string{mysqlDriver, pgxDriver}},                    // testdb's, to reach the servers
	{"integration_test/...", drivers},
}

// listedPackage is a package as go list -json reports it, with the
// imports of its files that build constraints leave out (IgnoredGoFiles)
// added to Imports, or to TestImports for a test file, so that a file
// built on another system or with another tag is placed as well.
type listedPackage struct {
	ImportPath     string
	Dir            string
	Module         struct{ Path string }
	Imports        []string
	TestImports    []string
	XTestImports   []string
	Deps           []string
	IgnoredGoFiles []string
}

// repoPackages lists every package of every module of the repository
// (each directory with a go.mod, from the root module's), each module
// with go list against its own go.mod.
var repoPackages = sync.OnceValues(func() ([]listedPackage, error) {
	var dirs []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && p != "." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")):
			return filepath.SkipDir
		case d.Name() == "go.mod":
			dirs = append(dirs, filepath.Dir(p))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	lists := make([][]listedPackage, len(dirs))
	errs := make([]error, len(dirs))
	var wg sync.WaitGroup
	for i, dir := range dirs {
		wg.Go(func() { lists[i], errs[i] = listModule(dir) })
	}
	wg.Wait()
	return slices.Concat(lists...), errors.Join(errs...)
})

// listModule lists the packages of the module in dir.
func listModule(dir string) ([]listedPackage, error) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,Module,Imports,TestImports,XTestImports,Deps,IgnoredGoFiles", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list in %s: %v\n%s", dir, err, stderr.Bytes())
	}
	var pkgs []listedPackage
	for d := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listedPackage
		if err := d.Decode(&p); err == io.EOF {
			return pkgs, nil
		} else if err != nil {
			return nil, fmt.Errorf("go list in %s: %v", dir, err)
		}
		for _, f := range p.IgnoredGoFiles {
			file, err := parser.ParseFile(token.NewFileSet(), filepath.Join(p.Dir, f), nil, parser.ImportsOnly)
			if err != nil {
				return nil, err
			}
			for _, imp := range file.Imports {
				ip, err := strconv.Unquote(imp.Path.Value)
				if err != nil {
					return nil, err
				}
				if strings.HasSuffix(f, "_test.go") {
					p.TestImports = append(p.TestImports, ip)
				} else {
					p.Imports = append(p.Imports, ip)
				}
			}
		}
		pkgs = append(pkgs, p)
	}
}

// within reports whether the package path p is root or below it.
func within(p, root string) bool {
	return p == root || strings.HasPrefix(p, root+"/")
}

// inRepo reports whether the package path p is of this repository.
func inRepo(p string) bool {
	return within(p, repoModule)
}

// match reports whether the package path p matches an entry of layers
// or driverLinks, and the entry's value that it matched: p itself, or
// for "x/...", the part of p that x matched.
func match(entry, p string) (string, bool) {
	rel := strings.TrimPrefix(strings.TrimPrefix(p, repoModule), "/")
	if rel == "" {
		rel = "."
	}
	base, tree := strings.CutSuffix(entry, "/...")
	want, got := strings.Split(base, "/"), strings.Split(rel, "/")
	if len(got) < len(want) || !tree && len(got) != len(want) {
		return "", false
	}
	for i, w := range want {
		if ok, _ := path.Match(w, got[i]); !ok {
			return "", false
		}
	}
	return strings.Join(got[:len(want)], "/"), true
}

// place returns the layer of the package path p, and the value of the
// entry that placed it; ok is false where no entry does.
func place(p string) (layer int, entry string, ok bool) {
	for i, l := range layers {
		for _, e := range l.packages {
			if v, ok := match(e, p); ok {
				return i, v, true
			}
		}
	}
	return 0, "", false
}

// moduleOf returns the module of the repository's package path p: the
// longest of modules that holds it.
func moduleOf(p string, modules []string) string {
	var m string
	for _, mod := range modules {
		if within(p, mod) && len(mod) > len(m) {
			m = mod
		}
	}
	return m
}

// internalTo returns the path that the package path p is internal to
// (the parent of its last "internal" element), or "".
func internalTo(p string) string {
	if i := strings.LastIndex(p+"/", "/internal/"); i >= 0 {
		return p[:i]
	}
	return ""
}

// layerFaults returns every import of pkgs that breaks the layers: a
// package or an import the list does not place, an import of a higher
// layer or of another entry of the package's own layer, and an import of
// a package internal to another module (go build allows it below
// github.com/idemkit/idem, and contrib's and the test modules' code would
// then depend on the root's internals).
func layerFaults(pkgs []listedPackage) []string {
	var modules []string
	for _, p := range pkgs {
		if !slices.Contains(modules, p.Module.Path) {
			modules = append(modules, p.Module.Path)
		}
	}
	var faults []string
	for _, p := range pkgs {
		layer, entry, ok := place(p.ImportPath)
		if !ok {
			faults = append(faults, fmt.Sprintf("package %s is in no layer: place it in deps_test.go's layers", p.ImportPath))
			continue
		}
		check := func(imp string, test bool) {
			if !inRepo(imp) {
				return
			}
			from, imports := p.ImportPath, "imports"
			if test {
				from, imports = p.ImportPath+"'s tests", "import"
			}
			if to := internalTo(imp); to != "" && moduleOf(to, modules) != p.Module.Path {
				faults = append(faults, fmt.Sprintf("%s, of module %s, %s %s, internal to module %s", from, p.Module.Path, imports, imp, moduleOf(to, modules)))
			}
			il, ie, ok := place(imp)
			switch {
			case !ok:
				faults = append(faults, fmt.Sprintf("%s %s %s, which is in no layer: place it in deps_test.go's layers", from, imports, imp))
			case test:
			case il > layer:
				faults = append(faults, fmt.Sprintf("%s (layer %d, %s) imports %s of a higher layer (%d, %s)", from, layer+1, layers[layer].name, imp, il+1, layers[il].name))
			case il == layer && ie != entry:
				faults = append(faults, fmt.Sprintf("%s imports %s, beside it in layer %d (%s): a package imports only its own entry's of its layer", from, imp, layer+1, layers[layer].name))
			}
		}
		for _, imp := range p.Imports {
			check(imp, false)
		}
		for _, imp := range slices.Concat(p.TestImports, p.XTestImports) {
			check(imp, true)
		}
	}
	return faults
}

// driverFaults returns every driver that a package of pkgs links and
// driverLinks does not allow it.
func driverFaults(pkgs []listedPackage) []string {
	var faults []string
	for _, p := range pkgs {
		var allowed []string
		for _, l := range driverLinks {
			if _, ok := match(l.packages, p.ImportPath); ok {
				allowed = l.drivers
				break
			}
		}
		for _, d := range drivers {
			if slices.Contains(allowed, d) {
				continue
			}
			for _, dep := range p.Deps {
				if within(dep, d) {
					faults = append(faults, fmt.Sprintf("package %s links the driver %s (%s)", p.ImportPath, d, dep))
					break
				}
			}
		}
	}
	return faults
}

// Each package of every module imports only the layers below it (and
// its own entry of its layer), as go list reports its imports.
func TestLayers(t *testing.T) {
	pkgs, err := repoPackages()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(pkgs, func(p listedPackage) bool { return p.ImportPath == repoModule }) {
		t.Fatalf("go list did not list %s", repoModule)
	}
	for _, f := range layerFaults(pkgs) {
		t.Error(f)
	}
}

// Only the packages driverLinks names link a database driver, and only
// the drivers it names.
func TestNoDriverImport(t *testing.T) {
	pkgs, err := repoPackages()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range driverFaults(pkgs) {
		t.Error(f)
	}
}

// The checks find each kind of fault, and only those.
func TestLayerFaults(t *testing.T) {
	pkg := func(rel, module string, imports, testImports, deps []string) listedPackage {
		p := listedPackage{ImportPath: path.Join(repoModule, rel), Imports: imports, TestImports: testImports, Deps: deps}
		p.Module.Path = path.Join(repoModule, module)
		return p
	}
	const (
		idem       = repoModule
		idemhttp   = repoModule + "/idemhttp"
		idemotel   = repoModule + "/idemotel"
		idempgx    = repoModule + "/idempgx"
		idemserve  = repoModule + "/idemserve"
		jsonsel    = repoModule + "/jsonsel"
		dburl      = repoModule + "/internal/dburl"
		watermill  = repoModule + "/contrib/idemwatermill"
		idemecho   = repoModule + "/contrib/idemecho"
		newPackage = repoModule + "/newpackage"
	)
	pkgs := []listedPackage{
		pkg(".", ".", []string{repoModule + "/schema", "fmt", idemhttp}, []string{idempgx}, []string{"github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgconn"}),
		pkg("idemserve", ".", []string{idem, jsonsel}, nil, nil),
		pkg("idempgx", ".", []string{idem, idemserve, idemotel}, nil, []string{"github.com/jackc/pgx/v5", "github.com/lib/pq"}),
		pkg("idemhttp", ".", []string{newPackage}, nil, []string{"modernc.org/sqlite/lib", "modernc.org/libc"}),
		pkg("newpackage", ".", nil, nil, nil),
		pkg("contrib/idemwatermill/jetstreamsub", "contrib/idemwatermill", []string{watermill, idemserve}, []string{dburl}, []string{"github.com/lib/pq"}),
		pkg("contrib/idemgin", "contrib/idemgin", []string{idemecho, idemhttp}, nil, nil),
		pkg("integration_test/internal/conformance", "integration_test", []string{idem, repoModule + "/integration_test/internal/cmdtest"}, nil, drivers),
	}
	want := []string{
		fmt.Sprintf("github.com/idemkit/idem (layer 2, %s) imports github.com/idemkit/idem/idemhttp of a higher layer (5, %s)", layers[1].name, layers[4].name),
		fmt.Sprintf("github.com/idemkit/idem/idemserve imports github.com/idemkit/idem/jsonsel, beside it in layer 3 (%s): a package imports only its own entry's of its layer", layers[2].name),
		"github.com/idemkit/idem/idemhttp imports github.com/idemkit/idem/newpackage, which is in no layer: place it in deps_test.go's layers",
		"package github.com/idemkit/idem/newpackage is in no layer: place it in deps_test.go's layers",
		"github.com/idemkit/idem/contrib/idemwatermill/jetstreamsub's tests, of module github.com/idemkit/idem/contrib/idemwatermill, import github.com/idemkit/idem/internal/dburl, internal to module github.com/idemkit/idem",
		fmt.Sprintf("github.com/idemkit/idem/contrib/idemgin imports github.com/idemkit/idem/contrib/idemecho, beside it in layer 8 (%s): a package imports only its own entry's of its layer", layers[7].name),
	}
	if got := layerFaults(pkgs); !slices.Equal(got, want) {
		t.Errorf("layerFaults:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	want = []string{
		"package github.com/idemkit/idem links the driver github.com/jackc/pgx (github.com/jackc/pgx/v5)",
		"package github.com/idemkit/idem/idempgx links the driver github.com/lib/pq (github.com/lib/pq)",
		"package github.com/idemkit/idem/idemhttp links the driver modernc.org/sqlite (modernc.org/sqlite/lib)",
	}
	if got := driverFaults(pkgs); !slices.Equal(got, want) {
		t.Errorf("driverFaults:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
