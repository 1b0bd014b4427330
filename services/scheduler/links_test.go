package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
)

// linksScheduler runs a scheduler with cfg on a real embedded NATS server
// and serves its web handler.
func linksScheduler(t *testing.T, cfg Config) (*nats.Conn, string) {
	t.Helper()
	nc, _ := bustest.Server(t)
	s, err := New(cfg, nc, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("scheduler: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); !s.Ready(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the scheduler is not ready")
		}
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return nc, srv.URL
}

func TestLinksAreAnsweredOverNATSAndOnTheWebPage(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want api.LinksReply
	}{
		{"on", Config{Optimizer: "on", OptimizerMin: 3, OptimizerMax: 30, OptimizerStart: 5, MaxPerHost: 40},
			api.LinksReply{Enabled: true, Min: 3, Max: 30, Start: 5, MaxPerHost: 40}},
		{"off", Config{Optimizer: "off"}, api.LinksReply{Min: 2, Max: 100, Start: 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc, base := linksScheduler(t, tc.cfg)
			var web api.LinksReply
			if code, body := get(t, base+"/api/links?history=1", &web); code != 200 || !strings.Contains(body, `"links":[]`) {
				t.Fatalf("GET /api/links: %d %s", code, body)
			}
			// The API is served once the scheduler leads: ask until it is.
			var msg *nats.Msg
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				var err error
				msg, err = nc.Request(api.SubjectLinks, []byte(`{"history":true}`), 10*time.Second)
				if err == nil {
					break
				}
				if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
					t.Fatal(err)
				}
			}
			var bus api.LinksReply
			if err := json.Unmarshal(msg.Data, &bus); err != nil {
				t.Fatal(err)
			}
			for _, got := range []api.LinksReply{web, bus} {
				if got.Enabled != tc.want.Enabled || got.Min != tc.want.Min || got.Max != tc.want.Max || got.Start != tc.want.Start ||
					got.MaxPerHost != tc.want.MaxPerHost || len(got.Links) != 0 {
					t.Fatalf("links %+v, want %+v", got, tc.want)
				}
			}
			resp, err := http.Get(base + "/")
			if err != nil {
				t.Fatal(err)
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(page), `<table id="links">`) || !strings.Contains(string(page), `fetch("api/links"`) {
				t.Fatal("the web page has no links table read from api/links")
			}
			msg, err = nc.Request(api.SubjectLinks, []byte(`{"history":`), 10*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if code := msg.Header.Get(micro.ErrorCodeHeader); code != "400" || !strings.Contains(msg.Header.Get(micro.ErrorHeader), "links request") {
				t.Fatalf("a malformed request: %q %q", code, msg.Header.Get(micro.ErrorHeader))
			}
		})
	}
}

func TestOnlyOperatorsAndAdministratorsListTheLinks(t *testing.T) {
	nc, _ := linksScheduler(t, Config{Optimizer: "on"})
	var m *nats.Msg
	eventually(t, func() string {
		var err error
		m, err = nc.Request(api.UserSubject(api.SubjectLinks, "alice"), nil, time.Second)
		if err != nil {
			return err.Error()
		}
		return ""
	})
	if code := m.Header.Get(micro.ErrorCodeHeader); code != "403" {
		t.Fatalf("a user asked for the links, which name every user's storage endpoints: %q %q", code, m.Header.Get(micro.ErrorHeader))
	}
}
