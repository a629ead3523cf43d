package house

import (
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

const module = "github.com/nomad-serverless/nomad-serverless/"

// imports walks the module and returns, per package directory, the
// module's packages its non-test files import (every file, whatever its
// build constraints: a platform's file ships on that platform).
func imports(t *testing.T) map[string][]string {
	t.Helper()
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, is := range f.Imports {
			p, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return err
			}
			if dep, ok := strings.CutPrefix(p, module); ok && !slices.Contains(out[pkg], dep) {
				out[pkg] = append(out[pkg], dep)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// violations lists every arrow of pkgs (package -> its imports) that
// breaks the house floors describes.
func violations(pkgs map[string][]string, floors map[string]int) []string {
	var out []string
	for pkg, deps := range pkgs {
		floor, ok := floors[pkg]
		if !ok {
			out = append(out, "package "+pkg+" has no floor: place it in house.Floors (and say what it is for in docs/design-notes.md)")
			continue
		}
		for _, dep := range deps {
			df, ok := floors[dep]
			switch {
			case !ok:
				// reported as its own package
			case floor < Roof && df >= Roof:
				out = append(out, pkg+" ships but imports "+dep+", which is test or benchmark machinery")
			case df >= floor:
				out = append(out, fmt.Sprintf("%s (floor %d) imports %s (floor %d): an arrow that does not run down", pkg, floor, dep, df))
			}
		}
	}
	for pkg := range floors {
		if _, ok := pkgs[pkg]; !ok {
			out = append(out, "house.Floors places "+pkg+", which is not a package (any more): take it out")
		}
	}
	slices.Sort(out)
	return out
}

func TestEveryArrowRunsDown(t *testing.T) {
	for _, v := range violations(imports(t), Floors) {
		t.Error(v)
	}
}

func TestViolations(t *testing.T) {
	floors := map[string]int{"spec": 0, "catalog": 20, "activator": 40, "test/fakecluster": 82}
	for _, tc := range []struct {
		name string
		pkgs map[string][]string
		want int
	}{
		{"down", map[string][]string{"spec": nil, "catalog": {"spec"}, "activator": {"catalog", "spec"}, "test/fakecluster": {"activator"}}, 0},
		{"up", map[string][]string{"spec": nil, "catalog": {"activator"}, "activator": nil, "test/fakecluster": nil}, 1},
		{"sideways", map[string][]string{"spec": nil, "catalog": {"catalog"}, "activator": nil, "test/fakecluster": nil}, 1},
		{"ships test machinery", map[string][]string{"spec": nil, "catalog": nil, "activator": {"test/fakecluster"}, "test/fakecluster": nil}, 1},
		{"unplaced", map[string][]string{"spec": nil, "catalog": nil, "activator": nil, "test/fakecluster": nil, "newpkg": nil}, 1},
		{"stale", map[string][]string{"spec": nil, "catalog": nil, "activator": nil}, 1},
	} {
		if got := violations(tc.pkgs, floors); len(got) != tc.want {
			t.Errorf("%s: %d violations %v, want %d", tc.name, len(got), got, tc.want)
		}
	}
}

func TestDatapathImportsNothingOfOurs(t *testing.T) {
	pkgs := imports(t)
	for _, pkg := range DatapathOnly {
		if _, ok := pkgs[pkg]; !ok {
			t.Errorf("%s is not a package", pkg)
		}
		for _, dep := range pkgs[pkg] {
			if dep != "spec" && !slices.Contains(DatapathOnly, dep) {
				t.Errorf("%s is on the request fast path and imports %s: it may import only its siblings and spec", pkg, dep)
			}
		}
	}
}

// What ships links no test-only module: go list's dependencies of every
// package below the roof (its non-test files, as the binary links them).
func TestShippedLinksNoTestOnlyModule(t *testing.T) {
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	var shipped []string
	for pkg, floor := range Floors {
		if floor < Roof {
			shipped = append(shipped, "./"+pkg)
		}
	}
	slices.Sort(shipped)
	cmd := exec.Command("go", append([]string{"list", "-deps", "-f", `{{if not .Standard}}{{.ImportPath}}{{end}}`}, shipped...)...)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+"spec") {
		t.Fatalf("go list -deps of the shipped packages does not list spec: %q", deps)
	}
	for _, dep := range deps {
		for _, m := range TestOnlyModules {
			if dep == m || strings.HasPrefix(dep, m+"/") {
				t.Errorf("a package that ships links %s, of the test-only module %s", dep, m)
			}
		}
	}
}
