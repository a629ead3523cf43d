package rawhttp

import "testing"

func TestParse(t *testing.T) {
	got := Parse([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 5\r\n\r\nab"))
	if len(got) != 2 {
		t.Fatalf("got %d responses %+v, want 2", len(got), got)
	}
	if got[0] != (Response{Status: 200, Body: "ok"}) {
		t.Errorf("first: %+v", got[0])
	}
	if got[1].Status != 400 || !got[1].Close || !got[1].Cut || got[1].Body != "ab" {
		t.Errorf("second: %+v, want a 400 saying close, cut after 2 of 5 bytes", got[1])
	}
	if n := len(Parse(nil)); n != 0 {
		t.Errorf("nothing read: %d responses", n)
	}
}
