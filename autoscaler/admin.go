package autoscaler

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/labstack/echo/v4"
)

// Admin API paths, mounted by RegisterAdmin on the control plane's admin
// port and used by RemoteSink and `nomad-serverless status`.
const (
	// PathRevisions: GET, the states of every revision (optionally
	// ?service=<name>) as a JSON array of RevisionState.
	PathRevisions = "/v1/autoscaler/revisions"
	// PathBurstCapacity: GET, {"revisions": {"<revision>": <ebc>, ...}}.
	PathBurstCapacity = "/v1/autoscaler/burst-capacity"
	// PathDemand: POST DemandReport, a remote activator's ReportDemand.
	// Signed by a control-plane replica (see WriteGuard).
	PathDemand = "/v1/autoscaler/demand"
	// PathWake: POST WakeRequest, a remote activator's Wake. Signed by a
	// control-plane replica (see WriteGuard).
	PathWake = "/v1/autoscaler/wake"
)

// DemandReport is the body of POST PathDemand.
type DemandReport struct {
	Replica string   `json:"replica"`
	Demand  []Demand `json:"demand"`
}

// WakeRequest is the body of POST PathWake.
type WakeRequest struct {
	Replica string `json:"replica"`
	Demand  Demand `json:"demand"`
}

// BurstCapacities is the answer of GET PathBurstCapacity.
type BurstCapacities struct {
	Revisions map[string]float64 `json:"revisions"`
}

// adminError is every error answer's body.
type adminError struct {
	Error string `json:"error"`
}

// maxAdminBody bounds a demand report (an activator holding thousands of
// revisions stays far below it).
const maxAdminBody = 4 << 20

// WriteGuard authenticates the admin API's state-changing requests: Wrap
// answers a request that is not from a control-plane replica itself (401)
// and passes the rest on. *adminauth.Verifier is one.
type WriteGuard interface {
	Wrap(next http.Handler) http.Handler
}

// RegisterAdmin mounts the autoscaler's admin endpoints on e. Every replica
// mounts them; on a replica that does not lead they answer 503 with
// ErrNotLeader's text, so callers look for the leader again.
//
// The writes (demand and wake) are mounted behind guard, which is
// required: anyone who reaches the admin port could otherwise scale every
// revision to its maximum. The reads stay open: `nomad-serverless status`
// runs with a deploy user's tokens, which cannot read the control plane's
// key, and they show what Nomad and Consul show that user anyway.
func RegisterAdmin(e *echo.Echo, a *Autoscaler, guard WriteGuard) error {
	if e == nil || a == nil {
		return errors.New("autoscaler: RegisterAdmin needs an echo instance and an Autoscaler")
	}
	if guard == nil {
		return errors.New("autoscaler: RegisterAdmin: guard is nil: the demand and wake endpoints must authenticate their callers")
	}
	signed := echo.WrapMiddleware(guard.Wrap)
	e.GET(PathRevisions, func(c echo.Context) error {
		if !a.Leading() {
			return notLeader(c)
		}
		states := a.States()
		if svc := c.QueryParam("service"); svc != "" {
			kept := states[:0]
			for _, s := range states {
				if s.Service == svc {
					kept = append(kept, s)
				}
			}
			states = kept
		}
		if states == nil {
			states = []RevisionState{}
		}
		return c.JSON(http.StatusOK, states)
	})
	e.GET(PathBurstCapacity, func(c echo.Context) error {
		if !a.Leading() {
			return notLeader(c)
		}
		m := a.EBCs()
		if m == nil {
			m = map[string]float64{}
		}
		return c.JSON(http.StatusOK, BurstCapacities{Revisions: m})
	})
	e.POST(PathDemand, func(c echo.Context) error {
		var r DemandReport
		if err := decodeBody(c, &r); err != nil {
			return badRequest(c, err)
		}
		if r.Replica == "" {
			return badRequest(c, errors.New("replica is empty"))
		}
		return answer(c, a.ReportDemand(c.Request().Context(), r.Replica, r.Demand))
	}, signed)
	e.POST(PathWake, func(c echo.Context) error {
		var r WakeRequest
		if err := decodeBody(c, &r); err != nil {
			return badRequest(c, err)
		}
		if r.Replica == "" {
			return badRequest(c, errors.New("replica is empty"))
		}
		ctx := extractWakeTrace(c.Request().Context(), c.Request().Header)
		return answer(c, a.Wake(ctx, r.Replica, r.Demand))
	}, signed)
	return nil
}

func decodeBody(c echo.Context, v any) error {
	dec := json.NewDecoder(io.LimitReader(c.Request().Body, maxAdminBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode body: %w", err)
	}
	return nil
}

func answer(c echo.Context, err error) error {
	switch {
	case err == nil:
		return c.NoContent(http.StatusNoContent)
	case errors.Is(err, ErrNotLeader):
		return notLeader(c)
	default:
		return badRequest(c, err)
	}
}

func notLeader(c echo.Context) error {
	return c.JSON(http.StatusServiceUnavailable, adminError{Error: ErrNotLeader.Error()})
}

func badRequest(c echo.Context, err error) error {
	return c.JSON(http.StatusBadRequest, adminError{Error: err.Error()})
}
