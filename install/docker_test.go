package install

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The Dockerfile cannot be built here (no Docker engine in the test
// environment), so these tests check it against the repository it builds:
// the Go image matches go.mod, the build target exists, the binary is static
// and is the entrypoint, and .dockerignore keeps what the build needs.
func TestDockerfileMatchesTheRepository(t *testing.T) {
	root := ".."
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	df, gomod, ignore := read("Dockerfile"), read("go.mod"), read(".dockerignore")

	goVer := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod)
	img := regexp.MustCompile(`(?m)^FROM golang:(\d+\.\d+)\S* AS build$`).FindStringSubmatch(df)
	if goVer == nil || img == nil || goVer[1] != img[1] {
		t.Errorf("build image golang:%v does not match go.mod's go %v", img, goVer)
	}
	build := regexp.MustCompile(`go build [^\n]*\\\n(?:[^\n]*\\\n)*[^\n]*-o (\S+) (\./\S+)`).FindStringSubmatch(df)
	if build == nil {
		t.Fatalf("no go build command in the Dockerfile")
	}
	if fi, err := os.Stat(filepath.Join(root, build[2])); err != nil || !fi.IsDir() {
		t.Errorf("the Dockerfile builds %s, which is not a package directory: %v", build[2], err)
	}
	if !strings.Contains(df, "CGO_ENABLED=0") {
		t.Errorf("the binary must be static (CGO_ENABLED=0) for distroless/static and for raw_exec/exec artifacts")
	}
	if !strings.Contains(df, "-X main.version=") {
		t.Errorf("the Dockerfile does not stamp main.version")
	}
	copyRE := regexp.MustCompile(`(?m)^COPY --from=build ` + regexp.QuoteMeta(build[1]) + ` (\S+)$`)
	cp := copyRE.FindStringSubmatch(df)
	if cp == nil {
		t.Fatalf("the final stage does not copy %s", build[1])
	}
	if !strings.Contains(df, `ENTRYPOINT ["`+cp[1]+`"]`) {
		t.Errorf("ENTRYPOINT is not the copied binary %s", cp[1])
	}
	for _, line := range strings.Split(ignore, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, needed := range []string{"go.mod", "go.sum", "cmd", "spec", "cmd/nomad-serverless/main.go"} {
			if ok, _ := filepath.Match(line, needed); ok || line == needed {
				t.Errorf(".dockerignore line %q excludes %s, which the build needs", line, needed)
			}
		}
	}
}
