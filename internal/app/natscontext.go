package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// NATSContext is a context of the nats command-line tool: the file
// <config>/nats/context/<name>.json, where <config> is $XDG_CONFIG_HOME or
// ~/.config, that `nats context add` writes; <config>/nats/context.txt
// names the selected one. Sluice reads it itself, as documented for the
// nats tool, rather than through jsm.go's natscontext, which would bring a
// JetStream management library and newer versions of modules the embedded
// server uses.
//
// Paths may start with ~ and hold $VARIABLES; a password or token may be
// env://VARIABLE. Settings that change how the tool connects and that
// Sluice does not follow (nsc lookups, a SOCKS proxy, an inline JWT and
// seed, TLS first, the Windows certificate store, op:// or nsc://
// references) are refused rather than ignored; description, JetStream
// domains and prefixes and the colour scheme do not matter to Sluice.
type NATSContext struct {
	Name string `json:"-"`
	Path string `json:"-"` // the file it was read from

	URL         string `json:"url"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Token       string `json:"token"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	InboxPrefix string `json:"inbox_prefix"`

	// Settings that Sluice refuses.
	NSC             string   `json:"nsc"`
	SocksProxy      string   `json:"socks_proxy"`
	UserJWT         string   `json:"user_jwt"`
	UserSeed        string   `json:"user_seed"`
	TLSFirst        bool     `json:"tls_first"`
	WinCertStore    string   `json:"windows_cert_store"`
	WinCertMatchBy  string   `json:"windows_cert_match_by"`
	WinCertMatch    string   `json:"windows_cert_match"`
	WinCACertsMatch []string `json:"windows_ca_certs_match"`
}

// natsConfigDir is where the nats tool keeps its contexts.
func natsConfigDir() (string, error) {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "nats"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("nats context: no home directory to find it in: %w", err)
	}
	return filepath.Join(home, ".config", "nats"), nil
}

// SelectedNATSContext returns the name of the context selected with
// `nats context select`, "" when none is.
func SelectedNATSContext() (string, error) {
	dir, err := natsConfigDir()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(dir, "context.txt"))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("nats context: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// LoadNATSContext reads the nats context of that name.
func LoadNATSContext(name string) (*NATSContext, error) {
	if name == "" || name == "." || strings.Contains(name, "..") || strings.ContainsAny(name, `/\`) {
		return nil, fmt.Errorf("nats context %q: not a context name", name)
	}
	dir, err := natsConfigDir()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "context", name+".json")
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("nats context %q: %w", name, err)
	}
	c := &NATSContext{Name: name, Path: path}
	if err := json.Unmarshal(b, c); err != nil {
		// Not quoted: a syntax error's offset is all that is shown.
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("nats context %q (%s): not JSON (at byte %d)", name, path, se.Offset)
		}
		return nil, fmt.Errorf("nats context %q (%s): not a nats context", name, path)
	}
	if err := c.resolve(); err != nil {
		return nil, fmt.Errorf("nats context %q (%s): %w", name, path, err)
	}
	return c, nil
}

// resolve refuses what Sluice does not follow, expands the paths and reads
// env:// references.
func (c *NATSContext) resolve() error {
	for field, set := range map[string]bool{
		"nsc": c.NSC != "", "socks_proxy": c.SocksProxy != "", "user_jwt": c.UserJWT != "", "user_seed": c.UserSeed != "",
		"tls_first": c.TLSFirst, "windows_cert_store": c.WinCertStore != "", "windows_cert_match_by": c.WinCertMatchBy != "",
		"windows_cert_match": c.WinCertMatch != "", "windows_ca_certs_match": len(c.WinCACertsMatch) > 0,
	} {
		if set {
			return fmt.Errorf("%s is set: Sluice does not follow it (take creds, nkey, user and password, or token instead)", field)
		}
	}
	for _, p := range []struct {
		field string
		v     *string
	}{{"creds", &c.Creds}, {"nkey", &c.NKey}, {"cert", &c.Cert}, {"key", &c.Key}, {"ca", &c.CA}} {
		if err := resolvePath(p.field, p.v); err != nil {
			return err
		}
	}
	for _, s := range []struct {
		field string
		v     *string
	}{{"password", &c.Password}, {"token", &c.Token}} {
		if err := resolveSecret(s.field, s.v); err != nil {
			return err
		}
	}
	return nil
}

// schemeOf returns the scheme of a reference ("op", "nsc", ...), "" for a
// plain value.
func schemeOf(v string) string {
	s, _, ok := strings.Cut(v, "://")
	if !ok || s == "" || strings.ContainsAny(s, "/ ") {
		return ""
	}
	return strings.ToLower(s)
}

// resolvePath turns file://PATH, ~ and $VARIABLES into a path.
func resolvePath(field string, v *string) error {
	switch schemeOf(*v) {
	case "":
	case "file":
		*v = strings.TrimPrefix((*v)[len("file"):], "://")
	default:
		return fmt.Errorf("%s is a %s:// reference: Sluice reads files only (a path, or file://PATH)", field, schemeOf(*v))
	}
	if *v == "" {
		return nil
	}
	p := os.ExpandEnv(*v)
	if p == "~" || strings.HasPrefix(p, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		p = filepath.Join(home, p[1:])
	}
	*v = p
	return nil
}

// resolveSecret reads an env://VARIABLE reference; a plain value is the
// secret itself.
func resolveSecret(field string, v *string) error {
	switch schemeOf(*v) {
	case "":
		return nil
	case "env":
		name := (*v)[len("env://"):]
		val, ok := os.LookupEnv(name)
		if !ok {
			return fmt.Errorf("%s: environment variable %s is not set", field, name)
		}
		*v = val
		return nil
	default:
		// Not quoted: it may be a password that looks like a URL.
		return fmt.Errorf("%s is a reference Sluice does not follow (it reads env://VARIABLE or the value itself)", field)
	}
}

// UseNATSContext takes the settings of a nats context that the
// configuration does not set itself: its URLs unless urlGiven (the
// environment or a flag named them); its login (user and password, token,
// creds or nkey) unless the configuration has one (a user, credentials,
// an nkey, or user information in the given URL), taking the context's
// login as a whole; each TLS file not set; its inbox prefix unless
// SLUICE_NATS_INBOX_PREFIX is set.
func (cfg *Config) UseNATSContext(c *NATSContext, urlGiven bool) {
	ownLogin := cfg.NATSUser != "" || cfg.NATSCreds != "" || cfg.NATSNkey != ""
	if urlGiven {
		if _, _, in := urlUser(cfg.NATSURL); in {
			ownLogin = true
		}
	} else if c.URL != "" {
		cfg.NATSURL = c.URL
		if ownLogin {
			// The configuration's login, not the one in the context's URL.
			cfg.NATSURL = stripUser(c.URL)
		}
	}
	take := func(dst *string, v, variable, field string) {
		if v == "" {
			return
		}
		*dst = v
		if cfg.fromContext == nil {
			cfg.fromContext = map[string]string{}
		}
		cfg.fromContext[variable] = fmt.Sprintf("%s of nats context %q", field, c.Name)
	}
	if !ownLogin {
		take(&cfg.NATSUser, c.User, "SLUICE_NATS_USER", "user")
		take(&cfg.NATSPassword, c.Password, "SLUICE_NATS_PASSWORD", "password")
		take(&cfg.natsToken, c.Token, "token", "token")
		take(&cfg.NATSCreds, c.Creds, "SLUICE_NATS_CREDS", "creds")
		take(&cfg.NATSNkey, c.NKey, "SLUICE_NATS_NKEY", "nkey")
	}
	if cfg.NATSTLSCA == "" {
		take(&cfg.NATSTLSCA, c.CA, "SLUICE_NATS_TLS_CA", "ca")
	}
	if cfg.NATSTLSCert == "" && cfg.NATSTLSKey == "" {
		take(&cfg.NATSTLSCert, c.Cert, "SLUICE_NATS_TLS_CERT", "cert")
		take(&cfg.NATSTLSKey, c.Key, "SLUICE_NATS_TLS_KEY", "key")
	}
	if cfg.NATSInboxPrefix == "" {
		take(&cfg.NATSInboxPrefix, c.InboxPrefix, "SLUICE_NATS_INBOX_PREFIX", "inbox_prefix")
	}
}
