package main

import (
	"bufio"
	"os"
	"strings"

	"github.com/kelseyhightower/envconfig"
)

// unprefixed are the variables read without the SLUICE_ prefix when the
// prefixed one is not set.
var unprefixed = map[string]bool{"NATS_URL": true, "NATS_USER": true, "NATS_PASSWORD": true}

// processEnv fills spec from SLUICE_* variables. envconfig on its own also
// reads each setting's name without the prefix (WORKERS, LEASE, NATS_PORT,
// ...), which other software sets: Kubernetes gives every pod NATS_PORT=
// tcp://... for a Service named nats. Those are hidden from it while it
// reads, all but the NATS_* ones above.
func processEnv(spec any) error {
	var keys strings.Builder
	if err := envconfig.Usagef("sluice", spec, &keys, "{{range .}}{{.Key}} {{.Alt}}\n{{end}}"); err != nil {
		return err
	}
	var hidden [][2]string
	defer func() {
		for _, h := range hidden {
			os.Setenv(h[0], h[1])
		}
	}()
	for sc := bufio.NewScanner(strings.NewReader(keys.String())); sc.Scan(); {
		key, alt, _ := strings.Cut(sc.Text(), " ")
		if alt == "" || alt == key || unprefixed[alt] {
			continue
		}
		if _, set := os.LookupEnv(key); set {
			continue // the prefixed one wins anyway
		}
		if v, set := os.LookupEnv(alt); set {
			hidden = append(hidden, [2]string{alt, v})
			os.Unsetenv(alt)
		}
	}
	return envconfig.Process("sluice", spec)
}
