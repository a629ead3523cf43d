package nomadjob_test

import (
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// The Nomad client is the autoscaler's Scaler in production, and every
// replica's Raiser for wakes.
var (
	_ autoscaler.Scaler = (*nomadjob.Client)(nil)
	_ autoscaler.Raiser = (*nomadjob.Client)(nil)
)
