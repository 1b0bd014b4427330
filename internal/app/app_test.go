package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/bus"
	"github.com/sluice-dtr/sluice/pkg/bus/tracing"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/token"
	"github.com/sluice-dtr/sluice/pkg/token/tokentest"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestRedactHidesPasswordsAndTokensOfNATSURLs(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"no user", "nats://nats:4222", "nats://nats:4222"},
		{"user and password", "nats://scheduler:s3cret@nats:4222", "nats://scheduler:xxxxx@nats:4222"},
		{"a token", "nats://s3cret@nats:4222", "nats://xxxxx@nats:4222"},
		{"no scheme", "scheduler:s3cret@nats:4222", "nats://scheduler:xxxxx@nats:4222"},
		{"a list", "nats://a:s3cret@n1:4222, nats://a:s3cret@n2:4222", "nats://a:xxxxx@n1:4222,nats://a:xxxxx@n2:4222"},
		{"a password that does not parse", "nats://a:s3cret%zz@nats:4222", "(a URL with user information that does not parse)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Redact(tt.in)
			if got != tt.want || strings.Contains(got, "s3cret") {
				t.Fatalf("Redact(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestTheNATSUserHasAnInboxPrefixOfItsOwn(t *testing.T) {
	tests := []struct {
		name   string
		cfg    Config
		prefix string
	}{
		{"no user", Config{NATSURL: "nats://nats:4222"}, ""},
		{"a user from the environment", Config{NATSURL: "nats://nats:4222", NATSUser: "delivery", NATSPassword: "pw"}, "_INBOX_delivery"},
		{"a user in the URL", Config{NATSURL: "nats://processor:pw@nats:4222"}, "_INBOX_processor"},
		{"the URL's user wins, as in nats.go", Config{NATSURL: "nats://processor:pw@nats:4222", NATSUser: "delivery"}, "_INBOX_processor"},
		{"a token in the URL", Config{NATSURL: "nats://token@nats:4222"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o nats.Options
			for _, opt := range tt.cfg.Options() {
				if err := opt(&o); err != nil {
					t.Fatal(err)
				}
			}
			if o.InboxPrefix != tt.prefix {
				t.Fatalf("inbox prefix %q, want %q", o.InboxPrefix, tt.prefix)
			}
			if tt.cfg.NATSUser != "" && (o.User != tt.cfg.NATSUser || o.Password != tt.cfg.NATSPassword) {
				t.Fatalf("user %q password %q", o.User, o.Password)
			}
		})
	}
}

// TestNoSecretReachesTheLogsOrTheSpans runs every role with known secrets
// (a NATS password in the URL, an HTTP bearer token file, S3 keys, DTR URLs
// with a password, an access_token and an S3 signature in their query),
// moves files that succeed and fail with them, and looks for the secrets in
// everything logged, at debug level, and in every span recorded.
func TestNoSecretReachesTheLogsOrTheSpans(t *testing.T) {
	secrets := map[string]string{
		"NATS password":       "natsPW" + strings.ReplaceAll(uuid.NewString(), "-", ""),
		"wrong NATS password": "wrongPW" + strings.ReplaceAll(uuid.NewString(), "-", ""),
		"HTTP token":          "bearer-" + uuid.NewString(),
		"S3 secret key":       "s3secret-" + uuid.NewString(),
		"URL password":        "urlpw-" + uuid.NewString(),
		"access_token":        "qtoken-" + uuid.NewString(),
		"X-Amz-Signature":     "sig" + strings.ReplaceAll(uuid.NewString(), "-", ""),
	}
	dir := t.TempDir()

	// Everything logged, by the roles' logger and by slog's default, and
	// every span.
	var logs syncBuffer
	log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	oldLog := slog.Default()
	slog.SetDefault(log)
	t.Cleanup(func() { slog.SetDefault(oldLog) })
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	oldTP := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(oldTP) })
	tracing.SkipUnsampledSpans(false)

	// NATS with a password.
	ns, err := bus.EmbeddedWith(filepath.Join(dir, "js"), 0, func(o *server.Options) {
		o.Users = []*server.User{{Username: "sluice", Password: secrets["NATS password"]}}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	natsURL := strings.Replace(ns.ClientURL(), "nats://", "nats://sluice:"+secrets["NATS password"]+"@", 1)

	// HTTP storage. (A bearer token goes over https only, to a server the
	// roles would have to trust: it is configured here for another host,
	// and must not show either.)
	files := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "" {
			http.Error(w, "a token over plain http", http.StatusBadRequest)
			return
		}
		if r.URL.Path != "/ok" {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "ok", time.Now(), strings.NewReader("the bytes of a file"))
	}))
	t.Cleanup(files.Close)
	filesHost := strings.TrimPrefix(files.URL, "http://")
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, secrets["HTTP token"]+"\n")

	// S3 with keys from a file.
	backend := s3mem.New()
	if err := backend.CreateBucket("out"); err != nil {
		t.Fatal(err)
	}
	s3srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(s3srv.Close)
	s3Host := strings.TrimPrefix(s3srv.URL, "http://")
	keyFile := filepath.Join(dir, "s3keys")
	writeFile(t, keyFile, "AKIASLUICETEST "+secrets["S3 secret key"]+"\n")
	local := filepath.Join(dir, "local")
	writeFile(t, local, "a local file")

	cfg := defaults(t)
	cfg.NATSURL = natsURL
	cfg.HTTPTokens = "storage.example.org=" + tokenFile
	cfg.AllowNetworks = []string{"127.0.0.0/8"}
	cfg.S3Credentials = s3Host + "=" + keyFile
	cfg.RetryBase = 100 * time.Millisecond
	cfg.Processor.StageDir = filepath.Join(dir, "stage")
	r := runRoles(t, cfg, Roles...)
	r.healthy(t, nil)
	// A role with a wrong password: it logs that it cannot connect.
	wrong := cfg
	wrong.NATSURL = strings.Replace(ns.ClientURL(), "nats://", "nats://sluice:"+secrets["wrong NATS password"]+"@", 1)
	wrongRun := runRoles(t, wrong, "processor")

	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo("sluice", secrets["NATS password"]))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rejected, err := nc.SubscribeSync(api.SubjectRejected)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	submit := func(src, dst string) uuid.UUID {
		t.Helper()
		id := uuid.New()
		b, _ := json.Marshal(map[string]string{"id": id.String(), "source": src, "destination": dst})
		if _, err := js.Publish(context.Background(), api.SubjectSubmit, b); err != nil {
			t.Fatal(err)
		}
		return id
	}
	query := "?access_token=" + secrets["access_token"] + "&X-Amz-Signature=" + secrets["X-Amz-Signature"]
	want := map[uuid.UUID]dtr.State{
		submit("http://"+filesHost+"/ok"+query, "s3://"+s3Host+"/out/ok"):                 dtr.Done,
		submit("http://"+filesHost+"/missing"+query, "file://"+filepath.Join(dir, "dst")): dtr.Error,
		submit("file://"+local, "s3://"+s3Host+"/no-such-bucket/k"+query):                 dtr.Error,
		submit("file://"+local, "http://"+filesHost+"/readonly"+query):                    dtr.Error,
	}
	submit("http://alice:"+secrets["URL password"]+"@"+filesHost+"/ok", "file://"+filepath.Join(dir, "dst2"))

	for id, state := range want {
		d := waitFinal(t, nc, id)
		if d.State != state {
			t.Errorf("DTR %s → %s: %s (%+v), want %s", d.Source, d.Destination, d.State, d.Error, state)
		}
	}
	m, err := rejected.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no rejection of the URL with a password: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(wrongRun.log.String(), "Authorization Violation") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}

	var spanText strings.Builder
	for _, s := range spans.GetSpans() {
		fmt.Fprintf(&spanText, "%s %v %s %v %v\n", s.Name, s.Attributes, s.Status.Description, s.Events, s.Links)
	}
	seen := map[string]string{
		"the logs":                  logs.String() + r.log.String(),
		"the wrong password's logs": wrongRun.log.String(),
		"the spans":                 spanText.String(),
		"the rejection event":       string(m.Data),
	}
	for what, text := range seen {
		for name, secret := range secrets {
			if strings.Contains(text, secret) {
				i := strings.Index(text, secret)
				t.Errorf("%s show the %s: …%s…", what, name, text[max(0, i-200):min(len(text), i+len(secret)+50)])
			}
		}
	}
	// What the logs and spans are made of, to be sure they were looked at.
	for what, needle := range map[string]string{
		"the logs":                  "grant failed",
		"the wrong password's logs": "Authorization Violation",
		"the spans":                 "PERMANENT_REMOTE: copy",
		"the rejection event":       "carries a password",
	} {
		if !strings.Contains(seen[what], needle) {
			t.Errorf("%s do not say %q:\n%s", what, needle, seen[what])
		}
	}
	if !strings.Contains(seen["the logs"], "access_token=xxxxx") {
		t.Errorf("the failed DTRs' URLs are not in the logs, redacted:\n%s", seen["the logs"])
	}
}

func writeFile(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// waitFinal asks the scheduler for a DTR until it is final.
func waitFinal(t *testing.T, nc *nats.Conn, id uuid.UUID) dtr.DTR {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		reply, err := nc.Request(api.SubjectDTR, []byte(id.String()), 5*time.Second)
		if err == nil {
			var r struct {
				DTR dtr.DTR `json:"dtr"`
			}
			if json.Unmarshal(reply.Data, &r) == nil && r.DTR.State.Final() {
				return r.DTR
			}
			last = string(bytes.TrimSpace(reply.Data))
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("DTR %s not final after 30s: %s", id, last)
	return dtr.DTR{}
}

// TestStorageTokensNameTheStorageAndThePathOfEachRequest: with
// SLUICE_STORAGE_TOKEN_* set, the token a transfer sends to a storage has
// that storage (scheme, host and port) as its audience and the request's
// path in its scope, storage.read for reads, storage.create for new files
// and storage.modify, with storage.read, for other changes.
func TestStorageTokensNameTheStorageAndThePathOfEachRequest(t *testing.T) {
	is := tokentest.Start(t)
	client := is.Client(t)
	cfg := Config{StorageTokens: token.StorageConfig{Issuer: is.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile, Margin: time.Minute}}
	source, err := cfg.storageTokens()
	if err != nil || source == nil {
		t.Fatalf("storage tokens: %v, %v", source, err)
	}
	tests := []struct {
		url       string
		access    transfer.Access
		audience  string
		wantScope string
	}{
		{"https://storage.example.org/data/f1", transfer.AccessRead, "https://storage.example.org:443", "storage.read:/data/f1"},
		{"https://storage.example.org:8443/data/dir/f2", transfer.AccessCreate, "https://storage.example.org:8443", "storage.create:/data/dir/f2"},
		{"https://storage.example.org:8443/data/dir/f3", transfer.AccessModify, "https://storage.example.org:8443", "storage.read:/data/dir/f3 storage.modify:/data/dir/f3"},
		// A space in the path cannot add a scope (the issuer splits scopes
		// on white space).
		{"https://storage.example.org/pub/a%20storage.modify:/", transfer.AccessRead, "https://storage.example.org:443", "storage.read:/pub/a%20storage.modify:/"},
	}
	for _, tt := range tests {
		u, _ := url.Parse(tt.url)
		raw, err := source(t.Context(), u, tt.access)
		if err != nil {
			t.Fatal(err)
		}
		v, err := token.NewVerifier(t.Context(), token.Config{Issuers: []string{is.URL}, Audience: []string{tt.audience}, Leeway: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c, err := v.Verify(t.Context(), raw)
		if err != nil {
			t.Fatalf("%s: the token is not for %s: %v", tt.url, tt.audience, err)
		}
		if want := strings.Fields(tt.wantScope); !slices.Equal(c.Scopes, want) {
			t.Fatalf("%s: scopes %q, want %q", tt.url, c.Scopes, want)
		}
	}
	// A path that a storage would resolve elsewhere: refused before the
	// issuer is asked, with the URL (without its password) named.
	before := is.TokenRequests()
	for _, raw := range []string{
		"https://storage.example.org/atlas/data/%2e%2e/user/bob/secret",
		"https://storage.example.org/atlas/data/%2E%2e/user/bob/secret",
		"https://storage.example.org/atlas/data/../user/bob/secret",
		"https://storage.example.org/atlas/data/./f",
		"https://storage.example.org/atlas/data%2f..%2fsecret",
		"https://storage.example.org/atlas/data/%5c..%5csecret",
		"https://user:hunter2@storage.example.org/atlas/data/%2e%2e/secret",
	} {
		u := &url.URL{}
		if err := u.UnmarshalBinary([]byte(raw)); err != nil {
			t.Fatal(err)
		}
		_, err := source(t.Context(), u, transfer.AccessRead)
		if err == nil || !strings.Contains(err.Error(), "no storage token for https://storage.example.org/atlas/data") ||
			!strings.Contains(err.Error(), "another path") || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: %v, want it refused naming the URL without its password", raw, err)
		}
	}
	if n := is.TokenRequests() - before; n != 0 {
		t.Errorf("the issuer was asked %d times for paths refused", n)
	}
	if none, err := (Config{}).storageTokens(); none != nil || err != nil {
		t.Fatalf("no issuer set: %v, %v; want no storage tokens", none, err)
	}
}

// TestTheWorkersDefaultsFillTheSchedulersDefaultSlots: from an empty
// environment, each stage has a worker for every slot the scheduler grants
// in it (its slots and emergency slots, in each of its states).
func TestTheWorkersDefaultsFillTheSchedulersDefaultSlots(t *testing.T) {
	var cfg Config
	if err := envconfig.Process("sluice_defaults_test", &cfg); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name          string
		workers, want int
	}{
		{"pre-processing (two states)", cfg.Processor.PreWorkers, 2 * (cfg.MaxProcessor + cfg.MaxEmergency)},
		{"post-processing", cfg.Processor.PostWorkers, cfg.MaxProcessor + cfg.MaxEmergency},
		{"delivery", cfg.Delivery.Workers, cfg.MaxDelivery + cfg.MaxEmergency},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.workers != tt.want {
				t.Fatalf("%d workers by default, for %d slots", tt.workers, tt.want)
			}
		})
	}
}

// TestARedirectToAPathWithEncodedDotsGetsNoStorageToken: the check of
// each path is made at every hop: a storage that redirects to
// /atlas/data/%2e%2e/user/bob/secret gets the request refused for good,
// no token asked for, and sees no second request.
func TestARedirectToAPathWithEncodedDotsGetsNoStorageToken(t *testing.T) {
	is := tokentest.Start(t)
	client := is.Client(t)
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.EscapedPath())
		mu.Unlock()
		http.Redirect(w, r, "/atlas/data/%2e%2e/user/bob/secret", http.StatusTemporaryRedirect)
	}))
	t.Cleanup(srv.Close)
	cfg := Config{StorageTokens: token.StorageConfig{Issuer: is.URL, ClientID: client.ID, ClientSecretFile: client.SecretFile, Margin: time.Minute}}
	source, err := cfg.storageTokens()
	if err != nil {
		t.Fatal(err)
	}
	guard, err := transfer.NewGuard("127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	c := transfer.New(srv.Client()).WithGuard(guard).WithTokenSource(source)
	_, err = c.Stat(t.Context(), srv.URL+"/atlas/data/f")
	if err == nil || !strings.Contains(err.Error(), "%2e%2e/user/bob/secret: its path holds a '..' segment") || transfer.KindOf(err) != dtr.ErrLocalFile {
		t.Fatalf("a redirect to an encoded '..': %v (%s), want it refused for good", err, transfer.KindOf(err))
	}
	if n := is.TokenRequests(); n != 1 {
		t.Errorf("%d token requests, want 1 (the first hop's)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Errorf("the storage saw %q, want the first request only", seen)
	}
}
