// Package app is the composition root: it wires Sluice's services
// together. One process can run any set of roles, each on its own NATS
// connection, with an embedded NATS server when asked; the processors and
// deliverers of a process share one transfer client. The command and the
// end-to-end tests both use it.
package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/auth"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/scitag"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/services/delivery"
	"github.com/sluice-dtr/sluice/services/generator"
	"github.com/sluice-dtr/sluice/services/processor"
	"github.com/sluice-dtr/sluice/services/scheduler"
)

// Config is everything the services read from the environment (SLUICE_*,
// and NATS_URL).
type Config struct {
	NATSURL   string `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222" desc:"NATS server of the roles and client commands (also read from NATS_URL); nats://user:password@host:4222 logs in as well"`
	Store     string `envconfig:"STORE" desc:"JetStream store of the embedded server (default: the user's data dir/sluice)"`
	NATSPort  int    `envconfig:"NATS_PORT" default:"4222" desc:"port of the embedded server on 127.0.0.1; 0 picks a free one"`
	LogLevel  string `envconfig:"LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	LogFormat string `envconfig:"LOG_FORMAT" default:"json" desc:"json or text"`

	// NATSUser and NATSPassword log the connections in; see Options.
	NATSUser     string `envconfig:"NATS_USER" desc:"NATS user of the roles and client commands (also read from NATS_USER); its replies come to the inbox prefix _INBOX_<user>, which the server must let it subscribe to (deploy/nats/sluice.conf does)"`
	NATSPassword string `envconfig:"NATS_PASSWORD" desc:"password of that user (also read from NATS_PASSWORD)"`
	// User is who the client commands speak as.
	User string `envconfig:"AS_USER" desc:"client commands: the Sluice user to speak as; requests go to that user's own subjects (dtr.submit.<user>, sluice.api.*.<user>), which the NATS server lets only that user publish to, and the user's jobs and DTRs are theirs; empty: the operator's subjects. A bearer token in BEARER_TOKEN or the file BEARER_TOKEN_FILE is sent with every request, and then names the caller"`
	// Other ways to log in to NATS, the inbox prefix and TLS; see
	// NATSOptions. natsToken is a nats context's token (UseNATSContext).
	NATSCreds       string `envconfig:"NATS_CREDS" desc:"NATS credentials file (a user JWT and its nkey seed, as nsc writes it) of the roles and client commands, instead of a user and password; replies come to _INBOX_<the JWT's name claim, else its public key>"`
	NATSNkey        string `envconfig:"NATS_NKEY" desc:"file holding the nkey seed (SU...) of an nkey user of the roles and client commands, instead of a user and password; replies come to _INBOX_<its public key>"`
	NATSInboxPrefix string `envconfig:"NATS_INBOX_PREFIX" desc:"inbox prefix of the roles and client commands, instead of the one their login gives (_INBOX_<user>, _INBOX_<JWT name>, _INBOX_<nkey public key>; none for a token or a client certificate alone)"`
	NATSTLSCA       string `envconfig:"NATS_TLS_CA" desc:"PEM file of the CAs that the NATS server's certificate must be signed by (default: the system's); set, it requires TLS, as a tls:// URL does"`
	NATSTLSCert     string `envconfig:"NATS_TLS_CERT" desc:"PEM client certificate for a NATS server that verifies clients (tls { verify: true }); requires TLS"`
	NATSTLSKey      string `envconfig:"NATS_TLS_KEY" desc:"PEM private key of SLUICE_NATS_TLS_CERT"`
	natsToken       string
	fromContext     map[string]string // setting → where in a nats context it came from
	// HTTPTokens names bearer token files per host.
	HTTPTokens string `envconfig:"HTTP_TOKENS" desc:"bearer tokens for HTTP(S) storage: host[:port]=/path/of/token/file,... (read at every request; sent over https only, to that host and port only, a host alone meaning port 443, judged again at every redirect; a plain http request to it is refused)"`
	// AllowNetworks, DenyAddresses and NATSMonitorPort say what the
	// roles' connections to storage may reach (guard.go).
	AllowNetworks   []string `envconfig:"ALLOW_NETWORKS" desc:"comma-separated networks (CIDRs or addresses, e.g. 127.0.0.0/8,10.0.0.0/8) that transfers may reach besides public addresses; loopback, private, link-local (cloud metadata), CGNAT and other internal addresses are refused unless listed here; 0.0.0.0/0,::/0 allows every address"`
	DenyAddresses   []string `envconfig:"DENY_ADDRESSES" desc:"comma-separated host:port that transfers never reach, whatever SLUICE_ALLOW_NETWORKS says; Sluice's own NATS server, its monitoring port and this process's HTTP server are always denied"`
	NATSMonitorPort int      `envconfig:"NATS_MONITOR_PORT" default:"8222" desc:"monitoring port of the NATS servers, denied to transfers on every NATS host; 0: none"`
	// CacheDir is the cache of downloads, shared by every processor and
	// deliverer; the scheduler routes downloads through it when it is set.
	// Heartbeat is how often each processor and deliverer says it is
	// alive and what it holds; the scheduler reads it too, for the
	// workers that do not say their own.
	Heartbeat time.Duration `envconfig:"HEARTBEAT" default:"5s" desc:"how often every processor and deliverer sends a heartbeat (sluice.heartbeat.<stage>) naming the grants it holds; the scheduler takes a worker that missed three to be silent (sluice workers, why, shares)"`
	CacheDir  string        `envconfig:"CACHE_DIR" desc:"cache of downloads (ARC's cache), shared by processors and deliverers: a remote file wanted again is linked from it instead of transferred; empty: no cache"`
	// S3Credentials names key files per S3 endpoint.
	S3Credentials string `envconfig:"S3_CREDENTIALS" desc:"keys for S3 endpoints: host[:port]=/path/of/file holding \"ACCESS_KEY SECRET_KEY\",...; others use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"`
	// FileRoots are the only directories file:// URLs may reach.
	FileRoots []string `envconfig:"FILE_ROOTS" desc:"comma-separated directories that file:// sources and destinations must lie under (\"..\" and symbolic links out of them are refused); processors add their staging area; empty: any path"`
	scheduler.Config
	// AuthConfig says who sends each message (pkg/auth): SLUICE_USERS and
	// SLUICE_ADMINS.
	AuthConfig
	// Tokens says which bearer tokens are taken (pkg/token).
	Tokens token.Config `envconfig:"TOKEN"`
	// StorageTokens says where per-storage tokens come from (pkg/token).
	StorageTokens token.StorageConfig `envconfig:"STORAGE_TOKEN"`
	Generator     generator.Config    `envconfig:"GENERATOR"`
	Processor     processor.Config    `envconfig:"PROCESSOR"`
	Delivery      delivery.Config     `envconfig:"DELIVERY"`
	// HTTPAddr is where the process serves /healthz, /metrics and, with
	// the scheduler, its web page; HTTP, if set, is a listener to use
	// instead.
	HTTPAddr string       `envconfig:"HTTP_ADDR" default:"127.0.0.1:8080" desc:"address of the HTTP server of every process: /healthz, /metrics (Prometheus), /debug/pprof/ and, where the scheduler runs, the live web page at /; empty: none"`
	HTTP     net.Listener `ignored:"true"`
	// HTTPTLSCert and HTTPTLSKey make that server serve HTTPS.
	HTTPTLSCert string `envconfig:"HTTP_TLS_CERT" desc:"PEM certificate (its chain after it) of the HTTP server: set with SLUICE_HTTP_TLS_KEY, it serves HTTPS only"`
	HTTPTLSKey  string `envconfig:"HTTP_TLS_KEY" desc:"PEM private key of SLUICE_HTTP_TLS_CERT"`
	// FTSListen is where the generator serves the FTS3 REST API; FTS, if
	// set, is a listener to use instead.
	FTSListen string       `envconfig:"FTS_LISTEN" desc:"address of the FTS3 REST API that the generator serves (POST /jobs, GET /jobs/<id>, DELETE /jobs/<id>, GET /whoami; bearer tokens only): host:port, or a port alone for 127.0.0.1:<port>; HTTPS with SLUICE_HTTP_TLS_CERT and _KEY, which any address but loopback requires; empty: not served"`
	FTS       net.Listener `ignored:"true"`
	// SciTags maps owners and activities to packet markings (pkg/scitag).
	SciTags scitag.Config `envconfig:"SCITAG"`
	// InProcess, if set, is an embedded server that the services reach
	// through nats.go's in-process connection instead of NATSURL.
	InProcess *server.Server `ignored:"true"`
	// StorageHTTP, if set, is the HTTP client that transfers use (one
	// that trusts a test's certificate authority); nil: Go's default,
	// which trusts the system's.
	StorageHTTP *http.Client `ignored:"true"`
}

// AuthConfig is auth.Config under a name of its own, so that Config can
// embed it beside scheduler.Config.
type AuthConfig = auth.Config

// Roles are the services one process can run.
var Roles = []string{"scheduler", "generator", "processor", "delivery"}

// Connect opens a NATS connection that keeps trying to reconnect for ever.
func Connect(url, name string, opts ...nats.Option) (*nats.Conn, error) {
	opts = append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond), nats.RetryOnFailedConnect(true)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", Redact(url), ExplainConnectError(err))
	}
	return nc, nil
}

// parseURL parses one NATS URL as nats.go does: without a scheme it is
// nats://.
func parseURL(s string) (*url.URL, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		s = "nats://" + s
	}
	return url.Parse(s)
}

// Redact returns NATS URLs (one or a comma-separated list) fit to log:
// passwords and tokens are replaced by xxxxx.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := parseURL(p)
		if err != nil {
			if strings.Contains(p, "@") {
				parts[i] = "(a URL with user information that does not parse)"
			}
			continue
		}
		if u.User == nil {
			continue
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		} else {
			u.User = url.User("xxxxx") // a token
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// connect opens a role's connection; what NATS reports asynchronously,
// such as a refused publish or subscription, goes to log.
func (cfg Config) connect(name string, log *slog.Logger) (*nats.Conn, error) {
	opts, err := cfg.NATSOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		if sub != nil {
			log.Error("NATS error", "connection", name, "subscription", sub.Subject, "err", err)
			return
		}
		log.Error("NATS error", "connection", name, "err", err)
	}), nats.ReconnectErrHandler(connectFailed(name, log)))
	if cfg.InProcess == nil {
		return Connect(cfg.NATSURL, name, opts...)
	}
	nc, err := nats.Connect("", append(opts, nats.Name(name), nats.InProcessServer(cfg.InProcess))...)
	if err != nil {
		return nil, fmt.Errorf("connect to the embedded NATS server in process: %w", err)
	}
	return nc, nil
}

// callers makes what establishes the caller of each message, for the
// roles that take messages from outside (scheduler and generator); nil
// when they do not run here.
func (cfg Config) callers(ctx context.Context, roles []string, log *slog.Logger) (*auth.Resolver, error) {
	if !slices.Contains(roles, "scheduler") && !slices.Contains(roles, "generator") {
		return nil, nil
	}
	var tokens auth.Verifier
	if len(cfg.Tokens.Issuers) > 0 {
		if len(cfg.Tokens.Audience) == 0 && !cfg.Tokens.AcceptAnyAudience {
			return nil, errors.New("SLUICE_TOKEN_ISSUERS is set but SLUICE_TOKEN_AUDIENCE is empty: name the audience that this Sluice's tokens carry")
		}
		tc := cfg.Tokens
		tc.Log = log
		v, err := token.NewVerifier(ctx, tc)
		if err != nil {
			return nil, fmt.Errorf("bearer tokens: %w", err)
		}
		tokens = tokenVerifier{v}
	}
	r, err := auth.NewResolver(cfg.AuthConfig, tokens)
	if err != nil {
		return nil, err
	}
	if len(cfg.FileRoots) == 0 {
		log.Warn("SLUICE_FILE_ROOTS is empty: file:// URLs are refused from every caller who is not trusted (only the operator's subjects and trusted users may name local paths)")
	}
	return r, nil
}

// storageTokens returns what asks the storage token issuer for a token
// per storage and path (WLCG: aud is the storage, the scope
// storage.read:<path>, storage.create:<path> or storage.modify:<path>):
// the submitter's rights by token exchange for work submitted with a
// token, Sluice's client's otherwise; nil if no issuer is set.
func (cfg Config) storageTokens() (transfer.TokenSource, error) {
	if cfg.StorageTokens.Issuer == "" {
		return nil, nil
	}
	src, err := token.NewStorageSource(cfg.StorageTokens)
	if err != nil {
		return nil, fmt.Errorf("storage tokens (SLUICE_STORAGE_TOKEN_*): %w", err)
	}
	return func(ctx context.Context, u *url.URL, access transfer.Access) (string, error) {
		p, err := scopePath(u)
		if err != nil {
			return "", transfer.TokenRefused(err)
		}
		scopes := make([]string, 0, 2)
		for _, a := range scopesOf[access] {
			scopes = append(scopes, string(a)+":"+p)
		}
		tok, err := src.ForRequest(ctx, transfer.Audience(u), strings.Join(scopes, " "))
		if err != nil && slices.ContainsFunc(finalTokenErrors, func(e error) bool { return errors.Is(err, e) }) {
			return "", transfer.TokenRefused(err)
		}
		return tok, err
	}, nil
}

// finalTokenErrors are the storage token failures that asking again will
// not change: the DTR fails at once. Any other (an issuer that cannot be
// reached, answers 5xx or times out; the bucket of submitters' tokens
// that cannot be read) is retried.
var finalTokenErrors = []error{
	token.ErrSubjectExpired,
	token.ErrExchangeRefused,
	token.ErrSubjectNotKept,
	token.ErrForeignIssuer,
}

// scopePath is the path of u as a storage scope names it: as escaped in
// the URL, so that a space in it cannot add a scope. It is refused if,
// decoded, it holds a '.' or '..' segment, an encoded '/' or a backslash:
// a storage that decodes and resolves it would reach another path than
// the one the scope seems to name (storage.read:/data/%2e%2e/secret is
// /secret to it). The TokenSource is asked at every hop, so a redirect to
// such a path is refused too, before any issuer is asked.
func scopePath(u *url.URL) (string, error) {
	esc := cmp.Or(u.EscapedPath(), "/")
	refuse := func(why string) error {
		return fmt.Errorf("no storage token for %s: its path %s; a storage would resolve it to another path than a token's scope names", transfer.Redact(u.String()), why)
	}
	if lower := strings.ToLower(esc); strings.Contains(lower, "%2f") || strings.Contains(lower, "%5c") {
		return "", refuse("holds an encoded '/' or '\\'")
	}
	p, err := url.PathUnescape(esc)
	if err != nil {
		return "", refuse("is badly escaped")
	}
	if strings.Contains(p, `\`) {
		return "", refuse("holds a backslash")
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == "." || seg == ".." {
			return "", refuse("holds a '" + seg + "' segment, plain or encoded")
		}
	}
	return esc, nil
}

// scopesOf are the storage scopes a token for a request of each access
// names: its own, and storage.read beside storage.modify, since a storage
// looks at what it is asked to delete or rename first (xrootd's SciTokens
// plugin refuses a DELETE with storage.modify alone).
var scopesOf = map[transfer.Access][]transfer.Access{
	transfer.AccessRead:   {transfer.AccessRead},
	transfer.AccessCreate: {transfer.AccessCreate},
	transfer.AccessModify: {transfer.AccessRead, transfer.AccessModify},
}

// transferClient builds the one transfer client of the process's
// processors and deliverers: the file roots (with the staging area, which
// processors write and deliverers read, and the cache), the credentials
// of SLUICE_HTTP_TOKENS, SLUICE_S3_CREDENTIALS and SLUICE_STORAGE_TOKEN_*,
// and the outbound guard, which knows ln, the process's own HTTP server.
func (cfg Config) transferClient(ln net.Listener) (*transfer.Client, error) {
	tokens, err := transfer.ParseTokens(cfg.HTTPTokens)
	if err != nil {
		return nil, err
	}
	s3keys, err := transfer.ParseTokens(cfg.S3Credentials)
	if err != nil {
		return nil, fmt.Errorf("S3 credentials: %w", err)
	}
	guard, err := cfg.guard(ln)
	if err != nil {
		return nil, err
	}
	storageTokens, err := cfg.storageTokens()
	if err != nil {
		return nil, err
	}
	client := transfer.New(cfg.StorageHTTP).WithGuard(guard).WithTokens(tokens).WithS3Credentials(s3keys).WithTokenSource(storageTokens)
	if len(cfg.FileRoots) > 0 {
		roots := append(slices.Clone(cfg.FileRoots), cfg.Processor.StageDirOrDefault())
		if cfg.CacheDir != "" {
			roots = append(roots, cfg.CacheDir)
		}
		files, err := transfer.OpenFiles(roots...)
		if err != nil {
			return nil, err
		}
		client = client.WithFiles(files)
	}
	return client, nil
}

// tokenVerifier gives auth what a verified token says.
type tokenVerifier struct{ v *token.Verifier }

func (t tokenVerifier) Verify(ctx context.Context, raw string) (auth.Token, error) {
	c, err := t.v.Verify(ctx, raw)
	if err != nil {
		return auth.Token{}, err
	}
	return auth.Token{ID: c.ID(), Groups: c.Groups, Scopes: c.Scopes}, nil
}

// Run runs the given roles until ctx ends or one of them fails.
func Run(ctx context.Context, cfg Config, roles []string, log *slog.Logger) error {
	if _, err := cfg.NATSOptions(); err != nil {
		return err
	}
	var err error
	var cert *tls.Certificate
	if cfg.HTTPTLSCert != "" || cfg.HTTPTLSKey != "" {
		if cert, err = httpCert(cfg.HTTPTLSCert, cfg.HTTPTLSKey); err != nil {
			return err
		}
	}
	ln := cfg.HTTP
	if ln == nil && cfg.HTTPAddr != "" {
		if ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
			return fmt.Errorf("HTTP server (SLUICE_HTTP_ADDR): %w", err)
		}
	}
	if ln != nil {
		defer ln.Close()
	}
	tags, err := scitag.New(cfg.SciTags)
	if err != nil {
		return err
	}
	fts, err := cfg.ftsListener(roles, cert != nil)
	if err != nil {
		return err
	}
	if fts != nil {
		defer fts.Close()
		cfg.FTS = fts // denied to transfers by the guard
	}
	var client *transfer.Client
	if slices.Contains(roles, "processor") || slices.Contains(roles, "delivery") {
		if client, err = cfg.transferClient(ln); err != nil {
			return err
		}
	}
	service := "sluice"
	if len(roles) == 1 {
		service += "-" + roles[0]
	}
	mp, metrics, err := newMetrics(service)
	if err != nil {
		return err
	}
	defer func() { _ = mp.Shutdown(context.Background()) }()
	meter := mp.Meter("github.com/sluice-dtr/sluice")
	mux := http.NewServeMux()
	var hl health
	if err := registerStoreFull(meter, &hl); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	mux.Handle("GET /healthz", &hl)
	mux.Handle("GET /metrics", metrics)
	// Go's profiles, as Loki and Mimir serve them: what a process spends
	// its CPU and memory on (go tool pprof http://<addr>/debug/pprof/profile).
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	site := index([]string{"/healthz", "/metrics", "/debug/pprof/"})

	callers, err := cfg.callers(ctx, roles, log)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	for _, role := range roles {
		nc, err := cfg.connect("sluice-"+role, log)
		if err != nil {
			return err
		}
		defer nc.Close()
		defer bus.ForgetSpace(nc)
		var run func(context.Context) error
		var ready func() bool
		switch role {
		case "scheduler":
			sc := cfg.Config
			sc.Cache = cfg.CacheDir != ""
			sc.Heartbeat = cfg.Heartbeat
			sc.Meter, sc.Callers, sc.FileRoots = meter, callers, cfg.FileRoots
			sc.StorageTokens = scheduler.StorageTokens{Keep: cfg.StorageTokens.Issuer != "",
				TTL: cfg.StorageTokens.SubjectTTL, FloorRate: cfg.StorageTokens.FloorRate}
			s, err := scheduler.New(sc, nc, log)
			if err != nil {
				return err
			}
			run, ready, site = s.Run, s.Ready, s.Handler()
		case "generator":
			gc := cfg.Generator
			gc.Meter, gc.Retention = meter, cfg.Retention
			gc.Callers, gc.FileRoots = callers, cfg.FileRoots
			gc.OwnerMaxDTRs, gc.OwnerMaxBytes = cfg.OwnerMaxDTRs, cfg.OwnerMaxBytes
			s, err := generator.New(gc, nc, log)
			if err != nil {
				return err
			}
			run = s.Run
			if fts != nil {
				g.Go(func() error { return serveHTTP(ctx, fts, s.FTSHandler(), cert, log, "the FTS3 REST API") })
			}
		case "processor":
			pc := cfg.Processor
			pc.Client, pc.CacheDir, pc.Meter, pc.Heartbeat = client, cfg.CacheDir, meter, cfg.Heartbeat
			pc.MaxFileSize = cfg.Delivery.MaxFileSize // one limit for every copy of a source
			run = processor.New(pc, nc, log).Run
		case "delivery":
			dc := cfg.Delivery
			dc.Client, dc.Meter, dc.Heartbeat, dc.SciTags = client, meter, cfg.Heartbeat, tags
			run = delivery.New(dc, nc, log).Run
		default:
			return fmt.Errorf("unknown role %q (roles: scheduler, generator, processor, delivery)", role)
		}
		hl.add(role, nc, ready)
		g.Go(func() error {
			hl.set(role, true, nil)
			err := run(ctx)
			hl.set(role, false, err)
			if err != nil {
				return fmt.Errorf("%s: %w", role, err)
			}
			return nil
		})
	}
	mux.Handle("/", site)
	if ln != nil {
		g.Go(func() error { return serveHTTP(ctx, ln, mux, cert, log, "/healthz, /metrics") })
	}
	return g.Wait()
}
