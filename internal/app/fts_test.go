package app

import (
	"strings"
	"testing"
)

func TestTheFTS3APIListensInClearOnLoopbackOnly(t *testing.T) {
	for _, tt := range []struct {
		name   string
		listen string
		tls    bool
		want   string // the address's host, or the error
	}{
		{"a port alone is loopback", "0", false, "127.0.0.1"},
		{"loopback in clear", "127.0.0.1:0", false, "127.0.0.1"},
		{"every address in clear", "0.0.0.0:0", false, "bearer tokens would cross the network in clear"},
		{"a name in clear", "sluice.example.org:0", false, "not a loopback address"},
		{"every address over TLS", "0.0.0.0:0", true, "0.0.0.0"},
		{"not an address", "127.0.0.1:x:y", false, "SLUICE_FTS_LISTEN"},
	} {
		cfg := Config{FTSListen: tt.listen}
		ln, err := cfg.ftsListener([]string{"generator"}, tt.tls)
		if ln != nil {
			host := ln.Addr().String()
			ln.Close()
			if !strings.HasPrefix(host, tt.want) && !(tt.want == "0.0.0.0" && strings.HasPrefix(host, "[::]")) {
				t.Errorf("%s: listens on %s, want %s", tt.name, host, tt.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
	if ln, err := (Config{FTSListen: "127.0.0.1:0"}).ftsListener([]string{"delivery"}, false); ln != nil || err != nil {
		t.Errorf("a process without the generator serves the FTS3 API: %v %v", ln, err)
	}
}
