package fakecluster

import (
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// interpolation matches ${...} references as Nomad resolves them in task
// config, env, service names, tags, meta and check paths.
var interpolation = regexp.MustCompile(`\$\{([^{}]+)\}`)

// interpolate replaces every ${name} that vars knows; unknown references
// stay as written, as Nomad leaves them.
func interpolate(s string, vars map[string]string) string {
	if !strings.Contains(s, "${") {
		return s
	}
	return interpolation.ReplaceAllStringFunc(s, func(m string) string {
		key := strings.TrimSpace(m[2 : len(m)-1])
		if v, ok := vars[key]; ok {
			return v
		}
		return m
	})
}

// interpolateValue interpolates every string inside a driver config value.
func interpolateValue(v any, vars map[string]string) any {
	switch x := v.(type) {
	case string:
		return interpolate(x, vars)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = interpolateValue(e, vars)
		}
		return out
	case []string:
		out := make([]string, len(x))
		for i, e := range x {
			out[i] = interpolate(e, vars)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = interpolateValue(e, vars)
		}
		return out
	}
	return v
}

// hostEnvDenylist is Nomad's default env.denylist: host variables never
// passed to tasks.
var hostEnvDenylist = map[string]bool{
	"CONSUL_TOKEN": true, "CONSUL_HTTP_TOKEN": true, "CONSUL_HTTP_TOKEN_FILE": true, "NOMAD_TOKEN": true,
	"VAULT_TOKEN": true, "CONSUL_LICENSE": true, "NOMAD_LICENSE": true, "VAULT_LICENSE": true,
	"CONSUL_LICENSE_PATH": true, "NOMAD_LICENSE_PATH": true, "VAULT_LICENSE_PATH": true,
	"AWS_ACCESS_KEY_ID": true, "AWS_SECRET_ACCESS_KEY": true, "AWS_SESSION_TOKEN": true,
	"GOOGLE_APPLICATION_CREDENTIALS": true,
}

// allocPort is one port of an allocation in host networking.
type allocPort struct {
	Label string
	Value int // the host port
	To    int // the port inside the task, 0 = the host port
}

// nodeVars are the node attributes the fake's single node offers to
// interpolation.
func nodeVars() map[string]string {
	return map[string]string{
		"node.unique.id":                  fakeNodeID,
		"node.unique.name":                fakeNodeName,
		"node.datacenter":                 "dc1",
		"node.region":                     "global",
		"node.class":                      "",
		"node.pool":                       "default",
		"attr.kernel.name":                "linux",
		"attr.unique.network.ip-address":  "127.0.0.1",
		"attr.consul.version":             ConsulVersion,
		"attr.nomad.version":              NomadVersion,
		"attr.driver.raw_exec":            "1",
		"attr.unique.hostname":            fakeNodeName,
		"attr.os.name":                    "linux",
		"attr.cpu.arch":                   "amd64",
		"attr.unique.consul.name":         consulNodeName,
		"attr.consul.datacenter":          "dc1",
		"attr.nomad.advertise.address":    "127.0.0.1:4646",
		"attr.unique.network.ip-address6": "",
	}
}

// allocVars are the NOMAD_* variables of a task of an allocation, with the
// node attributes, for interpolation and the task's environment.
func allocVars(a *alloc, task *api.Task, taskDir, allocDir string) map[string]string {
	job := a.Job
	tg := jobGroup(job, a.TaskGroup)
	v := nodeVars()
	set := func(k, val string) { v[k] = val }
	set("NOMAD_ALLOC_ID", a.ID)
	set("NOMAD_SHORT_ALLOC_ID", a.ID[:8])
	set("NOMAD_ALLOC_NAME", a.Name)
	set("NOMAD_ALLOC_INDEX", strconv.Itoa(a.Index))
	set("NOMAD_GROUP_NAME", a.TaskGroup)
	set("NOMAD_JOB_ID", deref(job.ID))
	set("NOMAD_JOB_NAME", deref(job.Name))
	set("NOMAD_JOB_PARENT_ID", deref(job.ParentID))
	set("NOMAD_NAMESPACE", a.Namespace)
	set("NOMAD_REGION", "global")
	set("NOMAD_DC", "dc1")
	set("NOMAD_ALLOC_DIR", allocDir)
	if task != nil {
		set("NOMAD_TASK_NAME", task.Name)
		set("NOMAD_TASK_DIR", taskDir+"/local")
		set("NOMAD_SECRETS_DIR", taskDir+"/secrets")
		if task.Resources != nil {
			set("NOMAD_CPU_LIMIT", strconv.Itoa(deref(task.Resources.CPU)))
			set("NOMAD_MEMORY_LIMIT", strconv.Itoa(deref(task.Resources.MemoryMB)))
		}
	}
	for _, p := range a.Ports {
		port := p.Value
		if p.To > 0 {
			port = p.To
		}
		hostAddr := "127.0.0.1:" + strconv.Itoa(p.Value)
		set("NOMAD_IP_"+p.Label, "127.0.0.1")
		set("NOMAD_PORT_"+p.Label, strconv.Itoa(port))
		set("NOMAD_ADDR_"+p.Label, "127.0.0.1:"+strconv.Itoa(port))
		set("NOMAD_HOST_IP_"+p.Label, "127.0.0.1")
		set("NOMAD_HOST_PORT_"+p.Label, strconv.Itoa(p.Value))
		set("NOMAD_HOST_ADDR_"+p.Label, hostAddr)
		set("NOMAD_ALLOC_IP_"+p.Label, "127.0.0.1")
		set("NOMAD_ALLOC_PORT_"+p.Label, strconv.Itoa(port))
		set("NOMAD_ALLOC_ADDR_"+p.Label, "127.0.0.1:"+strconv.Itoa(port))
	}
	meta := map[string]string{}
	for k, val := range job.Meta {
		meta[k] = val
	}
	if tg != nil {
		for k, val := range tg.Meta {
			meta[k] = val
		}
	}
	if task != nil {
		for k, val := range task.Meta {
			meta[k] = val
		}
	}
	for k, val := range meta {
		set("NOMAD_META_"+k, val)
		set("NOMAD_META_"+strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(k)), val)
		set("meta."+k, val)
	}
	return v
}

// taskEnv is a raw_exec task's environment: the host's (minus Nomad's
// denylist), the NOMAD_* variables, then the task's env, interpolated.
func taskEnv(vars map[string]string, task *api.Task) []string {
	env := map[string]string{}
	for _, kv := range os.Environ() {
		k, val, _ := strings.Cut(kv, "=")
		if !hostEnvDenylist[k] {
			env[k] = val
		}
	}
	for k, val := range vars {
		if strings.HasPrefix(k, "NOMAD_") {
			env[k] = val
		}
	}
	for k, val := range task.Env {
		env[interpolate(k, vars)] = interpolate(val, vars)
	}
	out := make([]string, 0, len(env))
	for k, val := range env {
		out = append(out, k+"="+val)
	}
	return out
}
