package spec

import "time"

// The tasks, volumes and disk of a revision beyond its serving task.
//
// A revision's Nomad group runs exactly one task that serves traffic (Task,
// the one with a port, named UserTaskName in the job) and the queue-proxy
// beside it. SideTasks are the user's other tasks: init steps (a prestart
// hook), helpers that run beside the app (prestart or poststart sidecars, or
// main tasks without a hook) and clean-up (poststop). They are part of the
// template, so changing one makes a new revision.

// Lifecycle hooks a side task may take, as Nomad spells them.
const (
	HookPrestart  = "prestart"
	HookPoststart = "poststart"
	HookPoststop  = "poststop"
)

// SideTask is one named task beside the serving task. Its fields are Nomad's
// task settings and are passed to Nomad as written.
type SideTask struct {
	Name      string            `json:"name"`
	Driver    string            `json:"driver"`
	Config    map[string]any    `json:"config,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Resources Resources         `json:"resources"`
	Artifacts []Artifact        `json:"artifacts,omitempty"`
	Templates []TaskTemplate    `json:"templates,omitempty"`
	User      string            `json:"user,omitempty"`
	// KillTimeout is how long Nomad waits after SIGTERM before SIGKILL.
	KillTimeout time.Duration `json:"kill_timeout"`
	// Lifecycle is nil for a main task, which runs beside the app for
	// the instance's whole life.
	Lifecycle    *Lifecycle    `json:"lifecycle,omitempty"`
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
}

// Lifecycle is a Nomad task's lifecycle block.
type Lifecycle struct {
	Hook string `json:"hook"`
	// Sidecar keeps a prestart or poststart task running beside the app
	// instead of running it to completion.
	Sidecar bool `json:"sidecar,omitempty"`
}

// InitStep reports whether the task runs to completion before the app
// starts (a prestart task that is not a sidecar): its time is part of every
// cold start.
func (t SideTask) InitStep() bool {
	return t.Lifecycle != nil && t.Lifecycle.Hook == HookPrestart && !t.Lifecycle.Sidecar
}

// Volume types.
const (
	VolumeHost = "host"
	VolumeCSI  = "csi"
)

// CSI access and attachment modes Nomad knows.
const (
	AccessSingleNodeReader  = "single-node-reader-only"
	AccessSingleNodeWriter  = "single-node-writer"
	AccessMultiNodeReader   = "multi-node-reader-only"
	AccessMultiNodeSingleWr = "multi-node-single-writer"
	AccessMultiNodeMultiWr  = "multi-node-multi-writer"
	AttachFileSystem        = "file-system"
	AttachBlockDevice       = "block-device"
)

// Volume is a group-level Nomad volume request: a host volume a client
// declares, or a CSI volume registered with Nomad.
type Volume struct {
	Name           string `json:"name"`
	Type           string `json:"type"`
	Source         string `json:"source"`
	ReadOnly       bool   `json:"read_only,omitempty"`
	AccessMode     string `json:"access_mode,omitempty"`
	AttachmentMode string `json:"attachment_mode,omitempty"`
	// PerAlloc gives every instance its own CSI volume, source[N] for
	// the instance with index N, so a single-writer volume can scale.
	PerAlloc bool `json:"per_alloc,omitempty"`
}

// VolumeMount mounts a declared Volume into a task.
type VolumeMount struct {
	Volume      string `json:"volume"`
	Destination string `json:"destination"`
	ReadOnly    bool   `json:"read_only,omitempty"`
}

// EphemeralDisk is the group's ephemeral_disk block. Sticky and Migrate
// only matter when Nomad replaces an instance on the same node or another:
// an instance that scales away and back is a new allocation either way.
type EphemeralDisk struct {
	SizeMB  int  `json:"size"`
	Sticky  bool `json:"sticky,omitempty"`
	Migrate bool `json:"migrate,omitempty"`
}

// MinEphemeralDiskMB is the least ephemeral disk Nomad accepts.
const MinEphemeralDiskMB = 10

// Defaults of the settings above.
const (
	// DefaultSideKillTimeout is Nomad's own kill_timeout: a named task
	// drains nothing of ours.
	DefaultSideKillTimeout = 5 * time.Second
	// DefaultEphemeralDiskMB is Nomad's default ephemeral disk, which an
	// ephemeral_disk block that leaves out size keeps.
	DefaultEphemeralDiskMB = 300
)

// SideTaskPath is the Problem path of the named task: task[migrate].
func SideTaskPath(name string) string { return "task[" + name + "]" }

// VolumePath is the Problem path of the named volume: volume[data].
func VolumePath(name string) string { return "volume[" + name + "]" }
