// Package house holds the project's layout as data: every package's floor
// in the house (packages as rooms, imports as arrows), and the rule that
// every arrow runs down. Its test reads the imports of every package's
// non-test files and fails on an arrow that runs sideways or up, on a
// package that ships importing test machinery, and on a package that has
// no floor yet (a new package is placed here on purpose, not by accident).
//
// Test files may import anything below the roof: a component test of the
// activator runs real sidecars through dev/localcluster, say. What ships is
// what the binary links, and that is what the floors constrain.
package house

// Floors is every package of the module, by path below the module, with
// its floor. A package may import only packages on lower floors. The
// numbers leave room: a new floor goes between two without renumbering.
var Floors = map[string]int{
	// The model and libraries that know nothing of Nomad or Consul.
	"spec":                 0,
	"adminauth":            0,
	"agenttls":             0,
	"tracing":              0, // OpenTelemetry from the OTEL_* environment
	"tasklog":              0, // a task's log files where Nomad keeps them, written by us
	"testapp":              5, // over tracing (its own spans)
	"datapath/rawio":       0,
	"datapath/h1":          0,
	"datapath/broadcast":   0,
	"datapath/h2proxy":     0,
	"datapath/h2relay":     5, // the HTTP/2 relay (issue 44): its state machines and the relay between connections; over rawio
	"datapath/keepalive":   5, // over rawio and h1
	"hcl":                  10,
	"canary":               10, // the rollout state machine, pure, over spec
	"nomadjob":             10,
	"consulroute":          10,
	"catalog":              20,
	"certs":                20, // over consulroute
	"sidecar":              30,
	"autoscaler":           30,
	"activator":            40,
	"dev/devagents":        50,
	"dev/localcluster":     50,
	"install":              50,
	"controlplane":         50,
	"rollout":              50,
	"dev":                  60, // over dev/devagents and dev/localcluster
	"cmd/nomad-serverless": 70,

	// Test machinery: above everything that ships, so it may use it; a
	// package that ships never imports one (Roof).
	"test/testbin":     80,
	"test/rawhttp":     81, // over testbin
	"test/rawh2":       80,
	"test/benchhttp":   80,
	"test/otlpsink":    80,
	"test/testcert":    80,
	"test/fakeagents":  80,
	"test/fixtures":    81, // over testbin
	"test/fakecluster": 82,
	"test/house":       80,
	// A gRPC app (grpc-go's interop service) and its command: grpc-go is
	// a dependency of test machinery only, so the shipped binary does not
	// link it.
	"test/grpcapp":             80,
	"test/grpcapp/cmd/grpcapp": 81,
	"bench/loadbench":          90,
	"bench/growth":             90, // reads make bench-scale's output
	"e2e":                      90,
}

// Roof is the first floor that does not ship: nothing below it may import
// anything at or above it.
const Roof = 80

// DatapathOnly are the packages that may import nothing of the module but
// each other and spec: the request fast path, kept small enough to read
// whole.
var DatapathOnly = []string{"datapath/rawio", "datapath/h1", "datapath/broadcast", "datapath/keepalive", "datapath/h2proxy", "datapath/h2relay"}

// TestOnlyModules are modules only test machinery and tests may use: a
// package that ships must not link them, directly or through another
// module (grpc-go would grow every sidecar's binary by megabytes for a test
// app's sake).
//
// gonum's plot draws the soak's figures (e2e): a test's picture, not
// something the binary ships.
var TestOnlyModules = []string{"google.golang.org/grpc", "gonum.org/v1/plot"}
