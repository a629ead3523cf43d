package tasklog

import (
	"errors"
	"path/filepath"
)

// Task is a command Nomad would have run itself, with what Run needs to
// stand between it and Nomad: where its log files go and where Nomad
// would have looked its command up.
type Task struct {
	// Command and Args are the task's config.command and config.args, as
	// Nomad interpolated them.
	Command string
	Args    []string
	// Dir is the task's directory (NOMAD_TASK_DIR's parent): Nomad looks
	// a command up in Dir/local, then in Dir, before the host.
	Dir string
	// Stdout and Stderr are the log files' bases, <alloc>/logs/<task>.stdout
	// and .stderr.
	Stdout, Stderr string
	// MaxFiles and MaxBytes bound each stream's files (MaxFiles and
	// MaxBytes, Nomad's defaults, when 0).
	MaxFiles int
	MaxBytes int64
}

// TaskFromEnv is the task Nomad started this process as: its log files
// where Nomad keeps them for NOMAD_TASK_NAME, under NOMAD_ALLOC_DIR, and
// its directory above NOMAD_TASK_DIR.
func TaskFromEnv(getenv func(string) string, command string, args []string) (Task, error) {
	alloc, name, local := getenv("NOMAD_ALLOC_DIR"), getenv("NOMAD_TASK_NAME"), getenv("NOMAD_TASK_DIR")
	if alloc == "" || name == "" || local == "" {
		return Task{}, errors.New("NOMAD_ALLOC_DIR, NOMAD_TASK_NAME and NOMAD_TASK_DIR must be set: Nomad starts this command")
	}
	logs := filepath.Join(alloc, "logs", name)
	return Task{Command: command, Args: args, Dir: filepath.Dir(local), Stdout: logs + ".stdout", Stderr: logs + ".stderr"}, nil
}
