package nomadjob

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Allocation is one instance of a revision as Nomad sees it.
type Allocation struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Revision string `json:"revision"`
	NodeName string `json:"node_name,omitempty"`
	// ClientStatus is pending, running, complete, failed or lost;
	// DesiredStatus run, stop or evict.
	ClientStatus  string `json:"client_status"`
	DesiredStatus string `json:"desired_status"`
	// Address is the node address the ports are bound on; HTTPPort is
	// the sidecar's serving port, AdminPort its stats port (0 until
	// placed, and not read for allocations that are stopped).
	Address   string `json:"address,omitempty"`
	HTTPPort  int    `json:"http_port,omitempty"`
	AdminPort int    `json:"admin_port,omitempty"`
	// Running: Nomad runs its tasks and means to keep it.
	Running  bool      `json:"running"`
	Restarts int       `json:"restarts,omitempty"`
	Created  time.Time `json:"created"`
	// Failure says why the allocation or one of its tasks failed, from
	// Nomad's task events ("" when nothing failed): what deploy prints
	// when a revision does not become ready.
	Failure string `json:"failure,omitempty"`
	// FailedTask is the task whose failure the others followed (an init
	// step that exited non-zero, say), "" when none failed: whose log
	// deploy shows.
	FailedTask string `json:"failed_task,omitempty"`
}

// Stopped reports whether the allocation is gone or on its way out.
func (a Allocation) Stopped() bool { return allocStopped(a.ClientStatus, a.DesiredStatus) }

// Starting reports whether the allocation is placed and meant to run but
// its client has not reported it running yet (Nomad's pending).
func (a Allocation) Starting() bool { return allocStarting(a.ClientStatus, a.DesiredStatus) }

// allocStarting: placed and meant to run, its client has not said running.
// The ports are assigned at placement, so its sidecar can be probed before
// Nomad hears that it runs (a client reports in batches).
func allocStarting(clientStatus, desiredStatus string) bool {
	return clientStatus == api.AllocClientStatusPending && desiredStatus == api.AllocDesiredStatusRun
}

// allocRunning: Nomad runs the allocation's tasks and means to keep it.
func allocRunning(clientStatus, desiredStatus string) bool {
	return clientStatus == api.AllocClientStatusRunning && desiredStatus == api.AllocDesiredStatusRun
}

// allocStopped: the allocation is told to stop, or complete, failed or lost.
func allocStopped(clientStatus, desiredStatus string) bool {
	switch clientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return true
	}
	return desiredStatus != api.AllocDesiredStatusRun
}

// Allocations lists a revision's current allocations (Nomad's default: the
// latest of each slot), newest first. For every allocation still meant to
// run it also reads the full allocation for its address and ports.
func (c *Client) Allocations(ctx context.Context, revision string) ([]Allocation, error) {
	ns := c.namespaceOf(revision)
	op := "list allocations of revision " + revision
	stubs, _, err := c.api.Jobs().Allocations(revision, false, c.query(ctx, ns))
	if err != nil {
		return nil, c.wrap(op, ns, capRead, err)
	}
	out := make([]Allocation, 0, len(stubs))
	for _, s := range stubs {
		a := Allocation{
			ID: s.ID, Name: s.Name, Revision: s.JobID, NodeName: s.NodeName,
			ClientStatus: s.ClientStatus, DesiredStatus: s.DesiredStatus,
			Created:    time.Unix(0, s.CreateTime).UTC(),
			Failure:    FailureSummary(s.ClientStatus, s.ClientDescription, s.TaskStates),
			FailedTask: FailedTask(s.TaskStates),
		}
		a.Running = allocRunning(a.ClientStatus, a.DesiredStatus)
		for _, ts := range s.TaskStates {
			if ts != nil {
				a.Restarts += int(ts.Restarts)
			}
		}
		if !a.Stopped() {
			full, _, err := c.api.Allocations().Info(s.ID, c.query(ctx, ns))
			switch {
			case err == nil:
				a.Address, a.HTTPPort, a.AdminPort = allocPorts(full.AllocatedResources, full.Resources)
			case errors.Is(c.wrap(op, ns, capRead, err), ErrNotFound):
				// Garbage-collected in between; keep what the stub says.
			default:
				return nil, c.wrap(op+": read allocation "+s.ID, ns, capRead, err)
			}
		}
		out = append(out, a)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Created.After(out[j].Created) })
	return out, nil
}

// allocPorts finds the node address and the host ports of the http and
// admin ports: AllocatedResources.Shared.Ports (Nomad 1.x), else the
// shared networks' ports, else the legacy Resources.Networks.
func allocPorts(ar *api.AllocatedResources, legacy *api.Resources) (addr string, httpPort, adminPort int) {
	if ar != nil {
		for _, p := range ar.Shared.Ports {
			switch p.Label {
			case spec.PortHTTP:
				httpPort, addr = p.Value, p.HostIP
			case spec.PortAdmin:
				adminPort = p.Value
				if addr == "" {
					addr = p.HostIP
				}
			}
		}
		if httpPort != 0 {
			return addr, httpPort, adminPort
		}
		if a, h, m := networkPorts(ar.Shared.Networks); h != 0 {
			return a, h, m
		}
	}
	if legacy != nil {
		return networkPorts(legacy.Networks)
	}
	return "", 0, 0
}

func networkPorts(nets []*api.NetworkResource) (addr string, httpPort, adminPort int) {
	for _, n := range nets {
		if n == nil {
			continue
		}
		for _, ports := range [][]api.Port{n.DynamicPorts, n.ReservedPorts} {
			for _, p := range ports {
				switch p.Label {
				case spec.PortHTTP:
					httpPort, addr = p.Value, n.IP
				case spec.PortAdmin:
					adminPort = p.Value
				}
			}
		}
	}
	return addr, httpPort, adminPort
}

// FailureSummary says why an allocation or its tasks failed, from Nomad's
// allocation status and task events, user task first; "" when nothing
// failed. It names the task and uses Nomad's own words (DisplayMessage)
// where they are the clearest, adding what a user should do for the common
// cases (image pull, out of memory, crash loop).
func FailureSummary(clientStatus, clientDescription string, states map[string]*api.TaskState) string {
	var parts []string
	for _, name := range taskOrder(states) {
		if msg := taskFailure(states[name]); msg != "" {
			parts = append(parts, fmt.Sprintf("task %s: %s", name, msg))
		}
	}
	if len(parts) == 0 && clientStatus == api.AllocClientStatusFailed {
		d := clientDescription
		if d == "" {
			d = "allocation failed"
		}
		parts = append(parts, d)
	}
	if len(parts) == 0 && clientStatus == api.AllocClientStatusLost {
		parts = append(parts, "allocation lost: its node stopped answering")
	}
	return strings.Join(parts, "; ")
}

// FailedTask names the task whose failure failed the allocation: the first
// (user task first, then the queue-proxy, then by name) that failed or is
// crash looping for a cause of its own, not because a sibling failed; ""
// when none did.
func FailedTask(states map[string]*api.TaskState) string {
	for _, name := range taskOrder(states) {
		ts := states[name]
		if taskFailure(ts) == "" || siblingFailed(ts) {
			continue
		}
		return name
	}
	return ""
}

// siblingFailed reports whether Nomad stopped the task because another
// failed.
func siblingFailed(ts *api.TaskState) bool {
	for _, e := range ts.Events {
		if e != nil && e.Type == api.TaskSiblingFailed {
			return true
		}
	}
	return false
}

// taskOrder puts the user task first, then the sidecar, then the rest.
func taskOrder(states map[string]*api.TaskState) []string {
	rank := func(n string) int {
		switch n {
		case spec.UserTaskName:
			return 0
		case spec.SidecarTaskName:
			return 1
		}
		return 2
	}
	names := slices.Sorted(maps.Keys(states))
	sort.SliceStable(names, func(i, j int) bool { return rank(names[i]) < rank(names[j]) })
	return names
}

// taskFailure reads one task's events, newest last, and describes its most
// telling failure; "" for a task that has not failed.
func taskFailure(ts *api.TaskState) string {
	if ts == nil {
		return ""
	}
	var cause, last string
	restartsExceeded := false
	for _, e := range ts.Events {
		if e == nil {
			continue
		}
		switch e.Type {
		case api.TaskDriverFailure:
			cause = "driver failure: " + firstOf(e.DriverError, e.DisplayMessage)
			if strings.Contains(strings.ToLower(cause), "pull") || strings.Contains(strings.ToLower(cause), "image") {
				cause += " (check the image name and that the node can pull it)"
			}
		case api.TaskSetupFailure:
			cause = "setup failed: " + firstOf(e.SetupError, e.DisplayMessage) + setupHint(firstOf(e.SetupError, e.DisplayMessage))
		case api.TaskFailedValidation:
			cause = "invalid task: " + firstOf(e.ValidationError, e.DisplayMessage)
		case api.TaskArtifactDownloadFailed:
			cause = "artifact download failed: " + firstOf(e.DownloadError, e.DisplayMessage)
		case api.TaskTerminated:
			switch {
			case e.Details["oom_killed"] == "true":
				cause = "killed for running out of memory; raise task.resources.memory"
			case e.ExitCode != 0:
				cause = fmt.Sprintf("exited with code %d", e.ExitCode)
				if e.Signal != 0 {
					cause += fmt.Sprintf(" (signal %d)", e.Signal)
				}
			case e.Signal != 0:
				cause = fmt.Sprintf("killed by signal %d", e.Signal)
			}
		case api.TaskNotRestarting:
			restartsExceeded = true
			last = e.DisplayMessage
		case api.TaskSiblingFailed:
			if cause == "" {
				cause = "stopped because task " + e.FailedSibling + " failed"
			}
		case api.TaskKilled, api.TaskKilling, api.TaskStarted, api.TaskReceived, api.TaskSetup, api.TaskRestarting, api.TaskDriverMessage:
			if e.FailsTask && cause == "" {
				cause = e.DisplayMessage
			}
		default:
			if e.FailsTask {
				cause = firstOf(e.DisplayMessage, e.Type)
			}
		}
	}
	if !ts.Failed && !restartsExceeded {
		// A task still running or restarting: report a cause only once
		// it has restarted, so deploy can say "crash looping".
		if ts.Restarts > 0 && cause != "" {
			return fmt.Sprintf("%s, restarted %d times", cause, ts.Restarts)
		}
		return ""
	}
	if cause == "" {
		cause = firstOf(last, "failed")
	}
	if restartsExceeded {
		cause += fmt.Sprintf(" (restarts exceeded after %d restarts)", ts.Restarts)
	}
	return cause
}

// setupHint says what to check when Nomad could not set an allocation up
// for a reason a user can fix; "" otherwise. The one worth words is Consul
// refusing the allocation's workload identity (Nomad 1.7+ with Consul's
// ACLs on): Nomad logs in to Consul's JWT auth method with each service's
// and task's identity, and gets no token when the auth method does not
// accept the JWT or no binding rule matches it.
func setupHint(msg string) string {
	if !strings.Contains(msg, "failed to derive Consul token") {
		return ""
	}
	const check = "`consul acl auth-method read -name nomad-workloads` and `consul acl binding-rule list -method nomad-workloads` show them; `nomad setup consul` makes both"
	if strings.Contains(msg, "Permission denied") {
		return " (Consul refused the allocation's workload identity: Consul's auth method, nomad-workloads unless the Nomad client's consul block names another, accepted the JWT but no binding rule matched it: " +
			"a service's identity needs a rule binding it to a service identity (selector \"nomad_service\" in value), a task's one binding it to a role; " + check + ")"
	}
	return " (Consul refused the allocation's workload identity: Consul's auth method, nomad-workloads unless the Nomad client's consul block names another, did not accept the JWT Nomad signed: " +
		"its JWKS URL or keys must be Nomad's, its bound audiences must include the identity's aud (consul.io), and a binding rule must match; " + check + ")"
}

func firstOf(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// serviceIDPrefix starts the Consul service ID Nomad gives a group
// service: _nomad-task-<allocation ID>-group-<group>-<service>-<port label>.
const serviceIDPrefix = "_nomad-task-"

// ServiceAllocID is the allocation a Consul service ID that Nomad
// registered belongs to; false for an ID Nomad did not make.
func ServiceAllocID(serviceID string) (string, bool) {
	rest, ok := strings.CutPrefix(serviceID, serviceIDPrefix)
	// An allocation ID is a UUID: 36 characters, then the "-group-" part.
	if !ok || len(rest) < 37 || rest[36] != '-' || strings.Count(rest[:36], "-") != 4 {
		return "", false
	}
	return rest[:36], true
}
