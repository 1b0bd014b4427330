package app

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// login is how the roles and client commands log in to NATS, worked out
// from the configuration: its options and the inbox prefix of its user.
type login struct {
	opts   []nats.Option
	prefix string // "": nats.go's default, _INBOX
}

// NATSOptions are the connection options of the configured NATS login and
// TLS, checked: a file that cannot be read or holds no credentials gives an
// error naming its variable and path, never its content.
//
// At most one way to log in is taken: a user and password (SLUICE_NATS_USER
// or the URL's user information; the URL's wins, as in nats.go), a token in
// the URL, a credentials file (SLUICE_NATS_CREDS) or an nkey seed file
// (SLUICE_NATS_NKEY). Replies come to an inbox prefix of the user's own,
// so that the server can keep every user from reading the replies meant
// for another: SLUICE_NATS_INBOX_PREFIX if set, else _INBOX_<user> for a
// user and password, _INBOX_<name> for credentials (the user JWT's name
// claim, or its subject, the user's public key, when it has no name) and
// _INBOX_<public key> for an nkey; a token or a client certificate alone
// keeps nats.go's _INBOX.
//
// SLUICE_NATS_TLS_CA (the CAs that the server's certificate must chain
// to, instead of the system's) and SLUICE_NATS_TLS_CERT with
// SLUICE_NATS_TLS_KEY (a client certificate, for a server that verifies
// clients) require TLS, as a tls:// URL does; nats.go reads the files
// again at every reconnection, so renewed certificates are taken up.
func (cfg Config) NATSOptions() ([]nats.Option, error) {
	l, err := cfg.login()
	if err != nil {
		return nil, err
	}
	opts := l.opts
	if l.prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(l.prefix))
	}
	tlsOpts, err := cfg.natsTLS()
	if err != nil {
		return nil, err
	}
	return append(opts, tlsOpts...), nil
}

// Options are NATSOptions; a configuration they refuse gives an option that
// fails nats.Connect with the reason.
func (cfg Config) Options() []nats.Option {
	opts, err := cfg.NATSOptions()
	if err != nil {
		return []nats.Option{func(*nats.Options) error { return err }}
	}
	return opts
}

// urlUser is the login in the first NATS URL: a user with a password, or
// a token (a user without one).
func urlUser(urls string) (user string, token, ok bool) {
	u, err := parseURL(strings.Split(urls, ",")[0])
	if err != nil || u.User == nil {
		return "", false, false
	}
	if _, pw := u.User.Password(); pw {
		return u.User.Username(), false, true
	}
	return "", true, true
}

func (cfg Config) login() (login, error) {
	var ways []string
	urlName, urlToken, inURL := urlUser(cfg.NATSURL)
	if inURL {
		ways = append(ways, "user information in the NATS URL")
	} else if cfg.NATSUser != "" {
		ways = append(ways, cfg.named("SLUICE_NATS_USER"))
	}
	if cfg.natsToken != "" && !inURL && cfg.NATSUser == "" {
		ways = append(ways, cfg.named("token"))
	}
	if cfg.NATSCreds != "" {
		ways = append(ways, cfg.named("SLUICE_NATS_CREDS"))
	}
	if cfg.NATSNkey != "" {
		ways = append(ways, cfg.named("SLUICE_NATS_NKEY"))
	}
	if len(ways) > 1 {
		return login{}, fmt.Errorf("NATS login: %s are all set: give one way to log in", strings.Join(ways, " and "))
	}
	var l login
	switch {
	case inURL:
		// nats.go logs in as the URL's user; a user without a password
		// is a token.
		if !urlToken {
			l.prefix = "_INBOX_" + urlName
		}
		if cfg.NATSUser != "" {
			l.opts = append(l.opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
		}
	case cfg.NATSUser != "":
		l.opts = append(l.opts, nats.UserInfo(cfg.NATSUser, cfg.NATSPassword))
		l.prefix = "_INBOX_" + cfg.NATSUser
	case cfg.natsToken != "":
		l.opts = append(l.opts, nats.Token(cfg.natsToken))
	case cfg.NATSCreds != "":
		name, err := credsUser(cfg.named("SLUICE_NATS_CREDS"), cfg.NATSCreds)
		if err != nil {
			return login{}, err
		}
		l.opts = append(l.opts, nats.UserCredentials(cfg.NATSCreds))
		l.prefix = "_INBOX_" + name
	case cfg.NATSNkey != "":
		pub, err := nkeyUser(cfg.named("SLUICE_NATS_NKEY"), cfg.NATSNkey)
		if err != nil {
			return login{}, err
		}
		opt, err := nats.NkeyOptionFromSeed(cfg.NATSNkey)
		if err != nil {
			return login{}, fmt.Errorf("%s %s: %w", cfg.named("SLUICE_NATS_NKEY"), cfg.NATSNkey, err)
		}
		l.opts = append(l.opts, opt)
		l.prefix = "_INBOX_" + pub
	}
	if cfg.NATSInboxPrefix != "" {
		l.prefix = cfg.NATSInboxPrefix
	}
	if l.prefix != "" {
		if err := checkPrefix(l.prefix); err != nil {
			what := cfg.named("SLUICE_NATS_INBOX_PREFIX")
			if cfg.NATSInboxPrefix == "" {
				what = "the inbox prefix of the NATS user"
			}
			return login{}, fmt.Errorf("%s %q: %w (set SLUICE_NATS_INBOX_PREFIX to one that is)", what, l.prefix, err)
		}
	}
	return l, nil
}

// named is how errors name a setting: its variable, or where in a nats
// context it came from.
func (cfg Config) named(variable string) string {
	if from, ok := cfg.fromContext[variable]; ok {
		return from
	}
	return variable
}

// checkPrefix refuses an inbox prefix that is no subject: nats.go refuses
// wildcards and a trailing dot, the server whitespace too.
func checkPrefix(p string) error {
	if strings.ContainsAny(p, "*> \t\r\n") || strings.HasSuffix(p, ".") || strings.HasPrefix(p, ".") || strings.Contains(p, "..") {
		return errors.New("is not a subject without wildcards")
	}
	return nil
}

// credsUser checks a credentials file (a user JWT and the user's nkey seed)
// and returns the user's name: the JWT's name claim, else its subject.
func credsUser(setting, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", setting, err)
	}
	defer wipe(b)
	bad := func(what string) error {
		return fmt.Errorf("%s %s: %s (a credentials file holds a user JWT and its nkey seed, as nsc writes it)", setting, file, what)
	}
	tok, err := nkeys.ParseDecoratedJWT(b)
	if err != nil {
		return "", bad("no user JWT in it")
	}
	claims, err := jwt.DecodeUserClaims(tok)
	if err != nil {
		return "", bad("no user JWT in it")
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return "", bad("no user nkey seed in it")
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || pub != claims.Subject {
		return "", bad("its nkey seed is not the key of its user JWT")
	}
	return cmpOr(claims.Name, claims.Subject), nil
}

// nkeyUser checks an nkey seed file and returns the user's public key.
func nkeyUser(setting, file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", setting, err)
	}
	defer wipe(b)
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return "", fmt.Errorf("%s %s: no user nkey seed (SU...) in it", setting, file)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("%s %s: no user nkey seed (SU...) in it", setting, file)
	}
	return pub, nil
}

func wipe(b []byte) {
	for i := range b {
		b[i] = 'x'
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// natsTLS checks the TLS files and returns nats.go's options for them.
func (cfg Config) natsTLS() ([]nats.Option, error) {
	var opts []nats.Option
	if cfg.NATSTLSCA != "" {
		b, err := os.ReadFile(cfg.NATSTLSCA)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cfg.named("SLUICE_NATS_TLS_CA"), err)
		}
		if !x509.NewCertPool().AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("%s %s: no PEM certificate in it", cfg.named("SLUICE_NATS_TLS_CA"), cfg.NATSTLSCA)
		}
		opts = append(opts, nats.RootCAs(cfg.NATSTLSCA))
	}
	if cfg.NATSTLSCert != "" || cfg.NATSTLSKey != "" {
		if cfg.NATSTLSCert == "" || cfg.NATSTLSKey == "" {
			return nil, fmt.Errorf("%s and %s go together: set both or neither", cfg.named("SLUICE_NATS_TLS_CERT"), cfg.named("SLUICE_NATS_TLS_KEY"))
		}
		if err := checkKeyPair(cfg.NATSTLSCert, cfg.NATSTLSKey); err != nil {
			return nil, fmt.Errorf("%s %s, %s %s: %w", cfg.named("SLUICE_NATS_TLS_CERT"), cfg.NATSTLSCert, cfg.named("SLUICE_NATS_TLS_KEY"), cfg.NATSTLSKey, err)
		}
		opts = append(opts, nats.ClientCert(cfg.NATSTLSCert, cfg.NATSTLSKey))
	}
	return opts, nil
}

// checkKeyPair loads a PEM certificate and its key. Its errors are the
// files' (not found, no PEM, a key that does not match), never a key's
// bytes.
func checkKeyPair(certFile, keyFile string) error {
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Stat(f); err != nil {
			return err
		}
	}
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "tls: "))
	}
	return nil
}

// loadKeyPair is checkKeyPair's certificate, for a server.
func loadKeyPair(certFile, keyFile string) (tls.Certificate, error) {
	if err := checkKeyPair(certFile, keyFile); err != nil {
		return tls.Certificate{}, err
	}
	return tls.LoadX509KeyPair(certFile, keyFile)
}

// stripUser returns NATS URLs without their user information.
func stripUser(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := parseURL(p)
		if err != nil || u.User == nil {
			continue
		}
		u.User = nil
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// connectFailed is a connection's nats.ReconnectErrHandler: it logs a
// failed attempt to connect, the first and then one whenever the reason
// changes or a minute has passed, with what the reason means for TLS.
// A role keeps trying (the server may not be up yet), so a server whose
// certificate does not verify shows here.
func connectFailed(name string, log *slog.Logger) nats.ConnErrHandler {
	var mu sync.Mutex
	var last string
	var at time.Time
	return func(nc *nats.Conn, err error) {
		err = ExplainConnectError(err)
		url := ""
		if nc != nil {
			url = Redact(strings.Join(append([]string{nc.Opts.Url}, nc.Opts.Servers...), ","))
			url = strings.Trim(url, ",")
		}
		mu.Lock()
		again := err.Error() == last && time.Since(at) < time.Minute
		if !again {
			last, at = err.Error(), time.Now()
		}
		mu.Unlock()
		if !again {
			log.Warn("cannot connect to NATS; trying again", "connection", name, "url", url, "err", err)
		}
	}
}

// ExplainConnectError adds to a failure to connect to NATS what it means
// for the TLS settings, where it is about them.
func ExplainConnectError(err error) error {
	if err == nil {
		return nil
	}
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	msg := err.Error()
	hint := ""
	switch {
	case errors.As(err, &unknown):
		hint = "the NATS server's certificate is not signed by a CA of SLUICE_NATS_TLS_CA (or of the system's, when it is not set)"
	case errors.As(err, &host):
		hint = "the NATS server's certificate is not for the host name of the URL"
	case errors.As(err, &invalid):
		hint = "the NATS server's certificate is not valid (expired?)"
	case strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate") || strings.Contains(msg, "unknown certificate authority"):
		hint = "the NATS server wants a client certificate that it trusts: SLUICE_NATS_TLS_CERT and SLUICE_NATS_TLS_KEY"
	case strings.Contains(msg, "closed by remote after TLS handshake"):
		hint = "the NATS server may not trust the client certificate, SLUICE_NATS_TLS_CERT, or want one"
	case errors.Is(err, nats.ErrSecureConnRequired):
		hint = "the NATS server requires TLS: use a tls:// URL or set SLUICE_NATS_TLS_CA"
	case errors.Is(err, nats.ErrSecureConnWanted):
		hint = "TLS is asked for (a tls:// URL or SLUICE_NATS_TLS_*) but the NATS server offers none"
	default:
		return err
	}
	return fmt.Errorf("%w (%s)", err, hint)
}
