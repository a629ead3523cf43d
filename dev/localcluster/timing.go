package localcluster

import "time"

// ScaleEvent is one Scale call, as `nomad job scaling-events` would list it.
type ScaleEvent struct {
	At     time.Time         `json:"at"`
	From   int               `json:"from"`
	To     int               `json:"to"`
	Reason string            `json:"reason"`
	Meta   map[string]string `json:"meta,omitempty"`
}

// InstanceTiming is the life of one instance. Zero times have not happened
// (yet). The cold-start split reads ScaleCalled -> Started (process start)
// -> AppListening/SidecarListening -> FirstCheckPass (Consul's view).
type InstanceTiming struct {
	Revision  string `json:"revision"`
	Alloc     string `json:"alloc"`
	Address   string `json:"address"`
	Port      int    `json:"port"`
	AdminPort int    `json:"admin_port"`
	AppPort   int    `json:"app_port"`
	// AppPID and SidecarPID are the processes (tests kill them to simulate
	// crashes).
	AppPID     int `json:"app_pid"`
	SidecarPID int `json:"sidecar_pid"`

	// ScaleCalled is when the Scale call that asked for this instance ran.
	ScaleCalled time.Time `json:"scale_called"`
	// Started is when both processes were started (the allocation became
	// Running in the catalog).
	Started time.Time `json:"started"`
	// AppListening and SidecarListening are the first successful TCP
	// connects to each port (polled every 2 ms).
	AppListening     time.Time `json:"app_listening"`
	SidecarListening time.Time `json:"sidecar_listening"`
	// FirstCheckPass is when the simulated Consul check first passed.
	FirstCheckPass time.Time `json:"first_check_pass"`
	// Stopping is when it left the ready list and stopped being Running;
	// Stopped when both processes had exited.
	Stopping time.Time `json:"stopping"`
	Stopped  time.Time `json:"stopped"`
	// ExitErr says what went wrong stopping it, if anything.
	ExitErr string `json:"exit_err,omitempty"`
}
