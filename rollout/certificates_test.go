package rollout

import (
	"slices"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/certs"
)

// Replicas' views merge per name: the certificate that expires last, the
// newest failure whichever replica had it; other services' names are left
// out; a valid name gets its https:// URL first.
func TestMergeCertificates(t *testing.T) {
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	r1 := []certs.NameStatus{
		{Name: "a.example.com", Service: "a", Namespace: "default", State: "valid", NotAfter: t0.Add(48 * time.Hour), Replica: "r1",
			LastError: "CA down", LastErrorAt: t0.Add(time.Hour)},
		{Name: "b.example.com", Service: "b", Namespace: "default", State: "valid", Replica: "r1"},
	}
	r2 := []certs.NameStatus{
		{Name: "a.example.com", Service: "a", Namespace: "default", State: "valid", NotAfter: t0.Add(90 * 24 * time.Hour), Replica: "r2",
			LastError: "CA down again", LastErrorAt: t0.Add(2 * time.Hour)},
		{Name: "a-tag.example.com", Service: "a", Namespace: "default", State: "ordering", Replica: "r2"},
	}
	got := mergeCertificates([][]certs.NameStatus{r1, r2}, "default", "a")
	if len(got) != 2 || got[0].Name != "a-tag.example.com" || got[1].Name != "a.example.com" {
		t.Fatalf("merged %+v", got)
	}
	if a := got[1]; !a.NotAfter.Equal(t0.Add(90*24*time.Hour)) || a.LastError != "CA down again" || a.Replica != "r2" {
		t.Errorf("a.example.com merged to %+v", a)
	}
	// The older failure stays when the newer certificate's replica had none.
	r2[0].LastError, r2[0].LastErrorAt = "", time.Time{}
	if a := mergeCertificates([][]certs.NameStatus{r1, r2}, "default", "a")[1]; a.LastError != "CA down" || a.Replica != "r1" || !a.NotAfter.Equal(t0.Add(90*24*time.Hour)) {
		t.Errorf("a.example.com merged to %+v", a)
	}
	urls := httpsURLs([]string{"http://a.example.com/", "http://a-tag.example.com/"}, got)
	if want := []string{"https://a.example.com/", "http://a.example.com/", "http://a-tag.example.com/"}; !slices.Equal(urls, want) {
		t.Errorf("URLs %v, want %v", urls, want)
	}
}
