package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/job"
)

// cpCommand copies one file as a job of its own, like
// fts-rest-transfer-submit SRC DST, and by default follows it to the end.
func cpCommand(cfg *Config) *cobra.Command {
	var (
		f        job.File
		name     string
		priority int
		noWait   bool
		owner    dtr.Identity
		o        submitOptions
	)
	c := &cobra.Command{
		Use:   "cp [flags] SOURCE DESTINATION",
		Short: "Copy one file: submit a job of that one file and follow it to the end",
		Long: "Copy one file: submit a job of that one file and, unless --no-wait, follow it to the end,\n" +
			"showing its progress. SOURCE and DESTINATION are URLs (file://, http(s)://, davs://, s3://,\n" +
			"root://...) or local paths, which become file:// URLs of their absolute paths. A local\n" +
			"destination makes the file a job input (a download, in the share's -download share); any other\n" +
			"an output. The exit status is 3 if the file was not copied.",
		Example: "  sluice cp ./data.bin /scratch/data.bin\n" +
			"  sluice cp --checksum adler32:0a1b2c3d https://store.example.org/f.root /scratch/f.root",
		Args: exactArgs(2, "cp needs a source and a destination"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if f.Source, err = fileURL(args[0]); err != nil {
				return usageErrorf("source: %w", err)
			}
			if f.Destination, err = fileURL(args[1]); err != nil {
				return usageErrorf("destination: %w", err)
			}
			j := job.Job{Name: name, Priority: priority, Owner: owner}
			if j.Name == "" {
				j.Name = "sluice cp " + baseName(f.Source)
			}
			if strings.HasPrefix(f.Destination, "file://") {
				j.Inputs = []job.File{f}
			} else {
				j.Outputs = []job.File{f}
			}
			data, err := json.Marshal(j)
			if err != nil {
				return err
			}
			o.wait = !noWait
			return submit(cmd, cfg, data, o)
		},
	}
	clientFlags(c, cfg)
	fs := c.Flags()
	fs.StringVar(&f.Checksum, "checksum", "", "expected checksum TYPE:VALUE (adler32, md5, sha256 or crc32c): a copy without it is made once more, then fails")
	fs.BoolVar(&f.Overwrite, "overwrite", false, "replace an existing destination")
	fs.StringArrayVar(&f.Replicas, "replica", nil, "another URL of the same source, tried when the source fails (repeatable)")
	fs.BoolVar(&f.Stage, "stage", false, "stage the source first (slow or tape-backed storage)")
	fs.StringVar((*string)(&f.TPC), "tpc", "", "auto (default), only or never: whether two HTTP(S)/WebDAV storages copy the file themselves (third-party copy)")
	fs.StringVar(&name, "name", "", "the job's name (default: sluice cp SOURCE's base name)")
	fs.IntVar(&priority, "priority", 0, "the job's priority, 1–100 (default 50)")
	fs.BoolVar(&noWait, "no-wait", false, "return once the job is submitted, printing its id")
	fs.StringVar(&owner.DN, "dn", "", "owner DN (taken from the operator and trusted users only; a user's job is their own)")
	fs.StringArrayVar(&owner.FQANs, "fqan", nil, "owner VOMS FQAN, e.g. /atlas/Role=production (repeatable; as --dn)")
	o.json = jsonFlag(c)
	return c
}

// baseName is the last element of a URL's path: never its query, which
// may hold a signed URL's token, nor its user info.
func baseName(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Path == "" {
		return "file"
	}
	return path.Base(u.Path)
}

// fileURL is arg as a URL: a URL with a scheme as it is, a local path as
// the file:// URL of its absolute path.
func fileURL(arg string) (string, error) {
	if arg == "" {
		return "", fmt.Errorf("empty")
	}
	if i := strings.Index(arg, "://"); i > 0 && !strings.ContainsAny(arg[:i], "/.") {
		return arg, nil
	}
	abs, err := filepath.Abs(arg)
	if err != nil {
		return "", err
	}
	return (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}).String(), nil
}
