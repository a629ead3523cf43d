package certs

import "time"

// RenewalWindowRatio is the part of a certificate's validity left when
// renewal starts: a third, as Let's Encrypt advises (60 days into a
// 90-day certificate), which leaves a month of retries to an ACME server
// that is down.
const RenewalWindowRatio = 1.0 / 3.0

// DefaultRenewCheckInterval is how often the certificates held are checked
// for renewal (certmagic's default). Certificates that live for minutes
// (a test CA) need it shorter: serve's -acme-renew-check.
const DefaultRenewCheckInterval = 10 * time.Minute

// Renewal is when a certificate the gateway obtained is renewed, as
// certmagic decides it with the configuration serve gives it. It is
// written out here so `status` can say when, and so the decision is
// tested against a clock (renewal_test.go holds certmagic to it).
type Renewal struct {
	// NotBefore and NotAfter are the certificate's validity.
	NotBefore, NotAfter time.Time
	// ARISelected is the moment the ACME server's renewal information
	// (RFC 9773, ARI) had us pick in its suggested window; zero when the
	// server offers none.
	ARISelected time.Time
	// CheckInterval is how often the maintenance looks (0: the default).
	CheckInterval time.Duration
}

// At is the first time a maintenance check finds the certificate due:
// the earliest of
//   - the ARI moment, one check interval early (the check before it
//     would otherwise be the last one before the moment);
//   - a third of the validity left (RenewalWindowRatio), which applies
//     with or without ARI, so a server that suggests a late window
//     cannot make us renew later than that;
//   - the emergency point: a fiftieth of the validity left, or five
//     check intervals, whichever is earlier from expiry.
func (r Renewal) At() time.Time {
	check := r.CheckInterval
	if check <= 0 {
		check = DefaultRenewCheckInterval
	}
	// certmagic counts validity to the end of NotAfter's second.
	expires := r.NotAfter.Truncate(time.Second).Add(time.Second)
	life := expires.Sub(r.NotBefore)
	at := expires.Add(-time.Duration(float64(life) * RenewalWindowRatio))
	emergency := expires.Add(-max(time.Duration(float64(life)/50), 5*check))
	at = minTime(at, emergency)
	if !r.ARISelected.IsZero() {
		at = minTime(at, r.ARISelected.Add(-check))
	}
	return at
}

// Due reports whether the certificate is due for renewal at now.
func (r Renewal) Due(now time.Time) bool { return now.After(r.At()) }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
