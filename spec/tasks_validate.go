package spec

import (
	"fmt"
	"regexp"
	"strings"
)

// taskName is what Nomad takes as a task name and what stays readable in
// `nomad alloc logs`: letters, digits, '-' and '_'.
var taskName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$`)

// validateSideTasks checks the named tasks and every volume_mount, the
// serving task's too.
func (t *Template) validateSideTasks() []Problem {
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{path, summary, detail}) }
	names := map[string]bool{}
	for _, st := range t.SideTasks {
		p := SideTaskPath(st.Name)
		switch {
		case !taskName.MatchString(st.Name):
			add(p+".name", fmt.Sprintf("task name %q is not allowed.", st.Name),
				"Use letters, digits, '-' and '_', starting with a letter or digit, at most 63 (it names the Nomad task).")
		case st.Name == UserTaskName || st.Name == SidecarTaskName:
			add(p+".name", fmt.Sprintf("task name %q is taken.", st.Name),
				fmt.Sprintf("In the revision's Nomad job %q is the serving task and %q our queue-proxy; name this task otherwise.", UserTaskName, SidecarTaskName))
		case names[st.Name]:
			add(p+".name", fmt.Sprintf("task %q is declared twice.", st.Name), "Task names are unique within a service.")
		}
		names[st.Name] = true
		if st.Driver == "" {
			add(p+".driver", fmt.Sprintf("task %q has no driver.", st.Name), "Set driver, for example driver = \"docker\".")
		} else {
			ps = append(ps, validateProcess(p, process{st.Driver, st.Config, st.Env, st.Resources, st.Artifacts, st.Templates})...)
		}
		if st.KillTimeout < 0 {
			add(p+".kill_timeout", fmt.Sprintf("kill_timeout is %s.", st.KillTimeout), "Use 0 or a positive duration.")
		}
		if l := st.Lifecycle; l != nil {
			switch l.Hook {
			case HookPrestart, HookPoststart:
			case HookPoststop:
				if l.Sidecar {
					add(p+".lifecycle.sidecar", fmt.Sprintf("task %q is a poststop sidecar.", st.Name),
						"A poststop task runs once the instance's other tasks have stopped, so there is nothing to run beside: remove sidecar = true.")
				}
			default:
				add(p+".lifecycle.hook", fmt.Sprintf("lifecycle hook %q is not one Nomad knows.", l.Hook),
					fmt.Sprintf("Use %q (before the app starts: an init step, or with sidecar = true a helper the app needs from its start), %q (once the app runs) or %q (once the instance stopped).",
						HookPrestart, HookPoststart, HookPoststop))
			}
		}
		ps = append(ps, t.validateMounts(p, st.VolumeMounts)...)
	}
	ps = append(ps, t.validateMounts("task", t.Task.VolumeMounts)...)
	return ps
}

// validateMounts checks a task's volume_mount blocks against the declared
// volumes.
func (t *Template) validateMounts(task string, ms []VolumeMount) []Problem {
	var ps []Problem
	declared := map[string]Volume{}
	for _, v := range t.Volumes {
		declared[v.Name] = v
	}
	dests := map[string]int{}
	for i, m := range ms {
		p := fmt.Sprintf("%s.volume_mount[%d]", task, i)
		_, ok := declared[m.Volume]
		switch {
		case m.Volume == "":
			ps = append(ps, Problem{p + ".volume", "volume_mount names no volume.", "Set volume to the name of a volume \"...\" {} block of the service."})
		case !ok:
			detail := "The service declares no volume: add volume \"" + m.Volume + "\" { type = \"host\" source = \"...\" } beside its tasks."
			if len(t.Volumes) > 0 {
				var names []string
				for _, v := range t.Volumes {
					names = append(names, v.Name)
				}
				detail = "Declared volumes: " + strings.Join(names, ", ") + ". Declare it with volume \"" + m.Volume + "\" { ... } or mount one of those."
			}
			ps = append(ps, Problem{p + ".volume", fmt.Sprintf("volume_mount of undeclared volume %q.", m.Volume), detail})
		}
		if !strings.HasPrefix(m.Destination, "/") && !strings.HasPrefix(m.Destination, "local/") &&
			!strings.HasPrefix(m.Destination, "secrets/") && !strings.HasPrefix(m.Destination, "alloc/") {
			ps = append(ps, Problem{p + ".destination", fmt.Sprintf("destination %q is not a path.", m.Destination),
				"Use an absolute path inside the task, such as \"/data\"."})
		} else if j, dup := dests[m.Destination]; dup {
			ps = append(ps, Problem{p + ".destination", fmt.Sprintf("destination %q is also mounted by volume_mount[%d].", m.Destination, j), "Mount each volume at its own path."})
		}
		dests[m.Destination] = i
	}
	return ps
}

// validateVolumes checks the volume blocks on their own.
func (t *Template) validateVolumes() []Problem {
	var ps []Problem
	for _, v := range t.Volumes {
		p := VolumePath(v.Name)
		add := func(path, summary, detail string) { ps = append(ps, Problem{p + path, summary, detail}) }
		if !taskName.MatchString(v.Name) {
			add(".name", fmt.Sprintf("volume name %q is not allowed.", v.Name), "Use letters, digits, '-' and '_'.")
		}
		if v.Source == "" {
			add(".source", "volume has no source.", "Name the client's host volume (type = \"host\") or the CSI volume's ID (type = \"csi\").")
		}
		switch v.Type {
		case VolumeHost:
			if v.PerAlloc {
				add(".per_alloc", "per_alloc is set on a host volume.", "per_alloc names one CSI volume per instance; Nomad takes it for type = \"csi\" only.")
			}
			if v.AccessMode != "" || v.AttachmentMode != "" {
				add(".access_mode", "a host volume takes no access_mode or attachment_mode.",
					"Nomad 1.6 refuses them on host volumes; remove them (read_only is how a host volume is mounted read-only).")
			}
		case VolumeCSI:
			switch v.AccessMode {
			case AccessSingleNodeReader, AccessSingleNodeWriter, AccessMultiNodeReader, AccessMultiNodeSingleWr, AccessMultiNodeMultiWr:
			case "":
				add(".access_mode", "a CSI volume needs an access_mode.",
					fmt.Sprintf("Use one of %q, %q, %q, %q or %q, as the volume was registered.", AccessSingleNodeReader, AccessSingleNodeWriter, AccessMultiNodeReader, AccessMultiNodeSingleWr, AccessMultiNodeMultiWr))
			default:
				add(".access_mode", fmt.Sprintf("access_mode %q is not one Nomad knows.", v.AccessMode),
					fmt.Sprintf("Use one of %q, %q, %q, %q or %q.", AccessSingleNodeReader, AccessSingleNodeWriter, AccessMultiNodeReader, AccessMultiNodeSingleWr, AccessMultiNodeMultiWr))
			}
			switch v.AttachmentMode {
			case AttachFileSystem, AttachBlockDevice:
			case "":
				add(".attachment_mode", "a CSI volume needs an attachment_mode.", fmt.Sprintf("Use %q or %q.", AttachFileSystem, AttachBlockDevice))
			default:
				add(".attachment_mode", fmt.Sprintf("attachment_mode %q is not one Nomad knows.", v.AttachmentMode), fmt.Sprintf("Use %q or %q.", AttachFileSystem, AttachBlockDevice))
			}
		default:
			add(".type", fmt.Sprintf("volume type %q is not one Nomad knows.", v.Type), fmt.Sprintf("Use %q (a client's host volume) or %q.", VolumeHost, VolumeCSI))
		}
	}
	if d := t.EphemeralDisk; d != nil && d.SizeMB < MinEphemeralDiskMB {
		ps = append(ps, Problem{"ephemeral_disk.size", fmt.Sprintf("ephemeral_disk size is %d MB.", d.SizeMB), fmt.Sprintf("Nomad needs at least %d MB.", MinEphemeralDiskMB)})
	}
	return ps
}

// validateVolumeScaling refuses what cannot scale: a CSI volume that only
// one instance can claim for writing (or, single-node, only instances on
// one node) on a service that may run more than one instance, unless each
// instance gets its own volume (per_alloc). Nomad would place the second
// instance and leave it pending on the claim: the service would look
// scaled up and serve with one.
func validateVolumeScaling(vs []Volume, s Scaling) []Problem {
	var ps []Problem
	if s.Max == 1 {
		return nil
	}
	most := "max is unbounded (0)"
	if s.Max > 1 {
		most = fmt.Sprintf("max is %d", s.Max)
	}
	for _, v := range vs {
		if v.Type != VolumeCSI || v.PerAlloc {
			continue
		}
		single := v.AccessMode == AccessSingleNodeWriter || v.AccessMode == AccessSingleNodeReader ||
			(v.AccessMode == AccessMultiNodeSingleWr && !v.ReadOnly)
		if !single {
			continue
		}
		ps = append(ps, Problem{VolumePath(v.Name) + ".access_mode",
			fmt.Sprintf("CSI volume %q is %s, and the service's scaling %s.", v.Name, v.AccessMode, most),
			"A second instance could not claim the volume and would wait forever. Set per_alloc = true (each instance claims its own volume, " +
				v.Source + "[0], " + v.Source + "[1], ...), or use a multi-node access mode, or set scaling { max = 1 }."})
	}
	return ps
}
