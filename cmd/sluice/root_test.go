package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/version"
)

func TestHelpAndVersionExitZero(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "Jobs and DTRs"},
		{[]string{"--help"}, "Run Sluice:"},
		{nil, "Usage:"},
		{[]string{"--version"}, "sluice " + version.String()},
		{[]string{"submit", "-h"}, "--wait"},
		{[]string{"help", "cp"}, "sluice cp [flags] SOURCE DESTINATION"},
		{[]string{"simulate", "--help"}, "--policies"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			var out bytes.Buffer
			if err := run(tt.args, &out); err != nil || !strings.Contains(out.String(), tt.want) {
				t.Fatalf("err %v, printed\n%s\nwant %q", err, out.String(), tt.want)
			}
		})
	}
}

func TestExitStatusSaysWhatWentWrong(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"an unknown command", []string{"fly"}, exitUsage},
		{"an unknown flag", []string{"shares", "--colour"}, exitUsage},
		{"a flag without its value", []string{"status", "--nats"}, exitUsage},
		{"too few arguments", []string{"priority", "7f0c3a4e-0000-4000-8000-000000000000"}, exitUsage},
		{"too many arguments", []string{"shares", "extra"}, exitUsage},
		{"an id that is no UUID", []string{"why", "not-a-uuid"}, exitUsage},
		{"a priority that is no number", []string{"priority", "7f0c3a4e-0000-4000-8000-000000000000", "high"}, exitUsage},
		{"bad share priorities", []string{"reconfigure", "atlas=high"}, exitUsage},
		{"a request the service finds malformed", nil, exitUsage},
		{"a job file that is not there", []string{"submit", "/nonexistent/job.json"}, exitFailed},
		{"no NATS server", []string{"shares", "--nats", "nats://127.0.0.1:1"}, exitFailed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error = &apiError{code: "400", text: `job list request: state "lost" is not running, finished, failed or ended`}
			if tt.args != nil {
				err = run(tt.args, &bytes.Buffer{})
			}
			if got := exitCode(err); got != tt.want {
				t.Fatalf("sluice %s: %v, exit %d; want exit %d", strings.Join(tt.args, " "), err, got, tt.want)
			}
		})
	}
	if exitCode(nil) != 0 || exitCode(&apiError{code: "404", text: "no DTR"}) != exitNotFound || exitCode(errors.New("x")) != exitFailed {
		t.Fatal("exitCode maps nil, a 404 answer or a plain error wrongly")
	}
}

func TestAnUnreadableEnvironmentStopsOnlyTheCommandsThatNeedIt(t *testing.T) {
	t.Setenv("SLUICE_MAXDELIVERY", "many")
	for _, args := range [][]string{{"--version"}, {"help"}, {"completion", "bash"}, {"man", t.TempDir()}} {
		if err := run(args, &bytes.Buffer{}); err != nil {
			t.Errorf("sluice %s: %v", strings.Join(args, " "), err)
		}
	}
	if err := run([]string{"shares"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "MAXDELIVERY") {
		t.Fatalf("sluice shares: %v, want the environment's error", err)
	}
}

func TestSingleDashLongFlagsStillWork(t *testing.T) {
	root := newRoot(&Config{}, nil, io.Discard)
	tests := []struct{ in, want []string }{
		{[]string{"submit", "-wait", "job.json"}, []string{"submit", "--wait", "job.json"}},
		{[]string{"bench", "-pipeline-stage", "2", "-nats=nats://x:4222"}, []string{"bench", "--pipeline-stage", "2", "--nats=nats://x:4222"}},
		{[]string{"submit", "-h"}, []string{"submit", "-h"}},
		{[]string{"submit", "-nosuchflag"}, []string{"submit", "-nosuchflag"}},
		{[]string{"submit", "--", "-wait"}, []string{"submit", "--", "-wait"}},
		{[]string{"cp", "--name", "-stage", "a", "b"}, []string{"cp", "--name", "-stage", "a", "b"}},
		{[]string{"submit", "-session-dir", "-wait", "j"}, []string{"submit", "--session-dir", "-wait", "j"}},
		{[]string{"cp", "-stage", "-overwrite", "a", "b"}, []string{"cp", "--stage", "--overwrite", "a", "b"}},
		{[]string{"status", "-help"}, []string{"status", "--help"}},
		{[]string{"-version"}, []string{"--version"}},
	}
	for _, tt := range tests {
		if got := longFlags(root, tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("longFlags(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestCompletionAndManPagesComeFromTheCommands(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		var out bytes.Buffer
		if err := run([]string{"completion", shell}, &out); err != nil || !strings.Contains(out.String(), "sluice") {
			t.Errorf("completion %s: %v (%d bytes)", shell, err, out.Len())
		}
	}
	var out bytes.Buffer
	if err := run([]string{"__complete", "help", ""}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"\nsubmit\n", "\npolicies\n", "\nprocessor\n"} {
		if !strings.Contains("\n"+out.String(), want) {
			t.Errorf("completing help offers\n%s\nwant %q", out.String(), want)
		}
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"__complete", "scheduler", "--policy", ""}, "\ndirac\n"},
		{[]string{"__complete", "simulate", "--policies", "arc,"}, "\narc,sam\n"},
		{[]string{"__complete", "jobs", "--state", ""}, "\nfailed\n"},
	} {
		out.Reset()
		if err := run(tt.args, &out); err != nil || !strings.Contains("\n"+out.String(), tt.want) {
			t.Errorf("%q offers (%v)\n%s\nwant %q", tt.args, err, out.String(), tt.want)
		}
	}
	dir := t.TempDir()
	if err := run([]string{"man", dir}, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	for _, page := range []string{"sluice.1", "sluice-cp.1", "sluice-submit.1", "sluice-completion-bash.1"} {
		b, err := os.ReadFile(filepath.Join(dir, page))
		if err != nil || !bytes.Contains(b, []byte(".TH \"SLUICE\"")) {
			t.Errorf("%s: %v\n%.200s", page, err, b)
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "sluice-submit.1"))
	if !bytes.Contains(b, []byte("wait")) {
		t.Errorf("sluice-submit.1 does not describe --wait:\n%s", b)
	}
}
