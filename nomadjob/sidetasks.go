package nomadjob

import (
	"maps"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// sideTasks compiles the user's named tasks as written: Nomad runs them by
// their lifecycle hooks around the app and the queue-proxy (see
// sidecarLifecycle for the order). They get K_SERVICE, K_CONFIGURATION and
// K_REVISION as the app does, unless they set them, so a log shipper or an
// agent can say whose it is; PORT stays the app's alone.
func sideTasks(rev spec.Revision) []*api.Task {
	var tasks []*api.Task
	for _, st := range rev.Template.SideTasks {
		env := maps.Clone(st.Env)
		if env == nil {
			env = map[string]string{}
		}
		for k, v := range map[string]string{spec.EnvKService: rev.Service, spec.EnvConfiguration: rev.Service, spec.EnvRevision: rev.Name()} {
			if _, set := env[k]; !set {
				env[k] = v
			}
		}
		task := &api.Task{
			Name:   st.Name,
			Driver: st.Driver,
			Config: cloneConfig(st.Config),
			Env:    env,
			User:   st.User,
			Resources: &api.Resources{
				CPU:      new(st.Resources.CPU),
				MemoryMB: new(st.Resources.MemoryMB),
			},
			KillTimeout:  new(st.KillTimeout),
			VolumeMounts: volumeMounts(st.VolumeMounts),
		}
		if l := st.Lifecycle; l != nil {
			task.Lifecycle = &api.TaskLifecycle{Hook: l.Hook, Sidecar: l.Sidecar}
		}
		addFiles(task, st.Artifacts, st.Templates)
		tasks = append(tasks, task)
	}
	return tasks
}

// volumes is the group's volume requests, keyed by name as Nomad takes
// them; nil without any.
func volumes(vs []spec.Volume) map[string]*api.VolumeRequest {
	if len(vs) == 0 {
		return nil
	}
	out := make(map[string]*api.VolumeRequest, len(vs))
	for _, v := range vs {
		out[v.Name] = &api.VolumeRequest{
			Name:           v.Name,
			Type:           v.Type,
			Source:         v.Source,
			ReadOnly:       v.ReadOnly,
			AccessMode:     v.AccessMode,
			AttachmentMode: v.AttachmentMode,
			PerAlloc:       v.PerAlloc,
		}
	}
	return out
}

func volumeMounts(ms []spec.VolumeMount) []*api.VolumeMount {
	var out []*api.VolumeMount
	for _, m := range ms {
		out = append(out, &api.VolumeMount{Volume: new(m.Volume), Destination: new(m.Destination), ReadOnly: new(m.ReadOnly)})
	}
	return out
}
