package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus/bustest"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

func TestPrintLinksShowsLimitsReasonsAndHistory(t *testing.T) {
	at := time.Date(2026, 1, 1, 12, 0, 10, 0, time.UTC)
	rec := api.LinkRecord{At: at, Running: 8, Throughput: 200e6, EMA: 180e6, Ended: 3, From: 8, Limit: 12, Reason: "probing: +50%"}
	link := api.LinkStatus{Source: "se.example:443", Destination: "local", Limit: 12, Running: 8, Throughput: 200e6, ErrorRate: 0.05,
		Last: &rec, History: []api.LinkRecord{rec}}
	for _, tc := range []struct {
		name    string
		reply   api.LinksReply
		history bool
		want    []string
		notWant []string
	}{
		{"off", api.LinksReply{MaxPerHost: 4}, false,
			[]string{"the per-link optimizer is off (SLUICE_OPTIMIZER=off)", "at most 4 transfers run per storage endpoint"}, []string{"SOURCE"}},
		{"no links yet", api.LinksReply{Enabled: true, Min: 2, Max: 100, Start: 8}, false,
			[]string{"limits 2–100, a new link starts at 8", "(no transfers between storage endpoints yet)"}, nil},
		{"a link", api.LinksReply{Enabled: true, Min: 2, Max: 100, Start: 8, Links: []api.LinkStatus{link}}, false,
			[]string{"se.example:443", "local", "200.0", "5.0%", "probing: +50%"}, []string{"AVG MB/S"}},
		{"with history", api.LinksReply{Enabled: true, Min: 2, Max: 100, Start: 8, Links: []api.LinkStatus{link}}, true,
			[]string{"se.example:443 → local", "AVG MB/S", "180.0", "8 → 12"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			printLinks(&b, tc.reply, tc.history)
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(b.String(), w) {
					t.Errorf("output has %q:\n%s", w, b.String())
				}
			}
		})
	}
}

func TestSimulateLinksRefusesBadArguments(t *testing.T) {
	cfg := &Config{}
	cfg.Optimizer = "on"
	for _, tc := range []struct {
		o    linkSimOptions
		want string
	}{
		{linkSimOptions{example: true, links: "x.csv"}, "not both"},
		{linkSimOptions{example: true, controllers: "sluice,tcp"}, `"tcp" is neither sluice nor fts3`},
		{linkSimOptions{links: "/nonexistent/links.csv", controllers: "sluice"}, "no such file"},
	} {
		tc.o.Duration = time.Minute
		if err := simulateLinks(cfg, tc.o, "", false, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
}

func TestLinksCommandAsksARunningScheduler(t *testing.T) {
	nc, _ := bustest.Server(t)
	s, err := scheduler.New(scheduler.Config{Optimizer: "on", OptimizerStart: 6}, nc, slog.New(slog.NewTextHandler(io.Discard, nil)))
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
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--history"}, "per-link optimizer: limits 2–100, a new link starts at 6"},
		{[]string{"--json"}, `"start": 6`},
	} {
		cfg := &Config{NATSURL: nc.ConnectedUrl()}
		c := linksCommand(cfg)
		var out bytes.Buffer
		c.SetOut(&out)
		c.SetArgs(append(tc.args, "--nats", nc.ConnectedUrl()))
		// The scheduler serves its API once it leads: ask until it does.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			err := c.Execute()
			if err == nil {
				break
			}
			if !errors.Is(err, nats.ErrNoResponders) || time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
		if !strings.Contains(out.String(), tc.want) {
			t.Errorf("sluice links %v:\n%s\nwant %q", tc.args, out.String(), tc.want)
		}
	}
}
