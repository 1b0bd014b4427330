package main

import (
	"flag"
	"os"

	"github.com/sluice-dtr/sluice/internal/app"
)

// clientFlagSet is the flag set of a client command (submit, status,
// shares, why, priority, cancel, reconfigure). Once its flags are parsed it
// takes the settings of the user's nats context that neither the flags nor
// the environment gave: the context named by --context, else by
// NATS_CONTEXT, else the one selected with `nats context select`, if any.
type clientFlagSet struct {
	*flag.FlagSet
	cfg     *Config
	context *string
}

func clientFlags(name string, cfg *Config) clientFlagSet {
	fs := flags(name, cfg)
	c := fs.String("context", "", "nats context to connect with (env NATS_CONTEXT; default: the one selected with `nats context select`); flags and SLUICE_* settings win over it")
	return clientFlagSet{FlagSet: fs, cfg: cfg, context: c}
}

// Parse parses the flags and takes the nats context's settings.
func (fs clientFlagSet) Parse(args []string) error {
	if err := fs.FlagSet.Parse(args); err != nil {
		return err
	}
	urlGiven := false
	fs.Visit(func(f *flag.Flag) { urlGiven = urlGiven || f.Name == "nats" })
	for _, v := range []string{"SLUICE_NATS_URL", "NATS_URL"} {
		if _, set := os.LookupEnv(v); set {
			urlGiven = true
		}
	}
	name := *fs.context
	if name == "" {
		name = os.Getenv("NATS_CONTEXT")
	}
	if name == "" {
		var err error
		if name, err = app.SelectedNATSContext(); err != nil || name == "" {
			return err
		}
	}
	c, err := app.LoadNATSContext(name)
	if err != nil {
		return err
	}
	fs.cfg.UseNATSContext(c, urlGiven)
	return nil
}
