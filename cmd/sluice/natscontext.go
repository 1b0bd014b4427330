package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/internal/app"
)

// clientFlags adds the flags every client command has (--nats, --context)
// and, before the command runs, takes the settings of the user's nats
// context that neither the flags nor the environment gave: the context
// named by --context, else by NATS_CONTEXT, else the one selected with
// `nats context select`, if any.
func clientFlags(c *cobra.Command, cfg *Config) {
	natsFlag(c.Flags(), cfg)
	name := c.Flags().String("context", "", `nats context to connect with (env NATS_CONTEXT; default: the one selected with "nats context select"); flags and SLUICE_* settings win over it`)
	c.PreRunE = func(cmd *cobra.Command, _ []string) error {
		urlGiven := cmd.Flags().Changed("nats")
		for _, v := range []string{"SLUICE_NATS_URL", "NATS_URL"} {
			if _, set := os.LookupEnv(v); set {
				urlGiven = true
			}
		}
		ctxName := *name
		if ctxName == "" {
			ctxName = os.Getenv("NATS_CONTEXT")
		}
		if ctxName == "" {
			var err error
			if ctxName, err = app.SelectedNATSContext(); err != nil || ctxName == "" {
				return err
			}
		}
		nc, err := app.LoadNATSContext(ctxName)
		if err != nil {
			return err
		}
		cfg.UseNATSContext(nc, urlGiven)
		return nil
	}
}
