package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kelseyhightower/envconfig"
)

func TestFlagsWinOverEnvironmentWhichWinsOverDefaults(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want int
	}{
		{"the built-in default", nil, nil, 10},
		{"the environment over the default", map[string]string{"SLUICE_MAXDELIVERY": "7"}, nil, 7},
		{"a flag over the environment", map[string]string{"SLUICE_MAXDELIVERY": "7"}, []string{"-maxdelivery", "9"}, 9},
		{"a flag over the default", nil, []string{"-maxdelivery=3"}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			var cfg Config
			if err := envconfig.Process("sluice", &cfg); err != nil {
				t.Fatal(err)
			}
			if err := serveFlags("scheduler", &cfg).Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			if cfg.MaxDelivery != tt.want {
				t.Fatalf("maxdelivery = %d, want %d", cfg.MaxDelivery, tt.want)
			}
		})
	}
}

func TestNATSURLComesFromTheUnprefixedVariable(t *testing.T) {
	t.Setenv("NATS_URL", "nats://elsewhere:4222")
	var cfg Config
	if err := envconfig.Process("sluice", &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.NATSURL != "nats://elsewhere:4222" {
		t.Fatalf("NATS URL = %q", cfg.NATSURL)
	}
}

func TestHelpListsCommandsAndVariables(t *testing.T) {
	var out bytes.Buffer
	if err := run([]string{"help"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"sluice all", "sluice demo", "sluice shares", "SLUICE_MAXDELIVERY", "SLUICE_SHAREPOLICY", "NATS_URL", "SLUICE_DELIVERY_WORKERS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help does not mention %s", want)
		}
	}
}

func TestBadConfigurationIsRefusedWithTheReason(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SLUICE_SHAREPOLICY": "voms:colour"}, "share policy"},
		{map[string]string{"SLUICE_SHAREPRIORITY": "atlas=200"}, "1–100"},
		{map[string]string{"SLUICE_MAXDELIVERY": "many"}, "MAXDELIVERY"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			err := run([]string{"scheduler", "-nats", "nats://127.0.0.1:1"}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

func TestUnknownCommandIsAnError(t *testing.T) {
	err := run([]string{"fly"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `unknown command "fly"`) {
		t.Fatalf("got %v", err)
	}
}
