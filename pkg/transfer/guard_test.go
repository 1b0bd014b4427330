package transfer_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

func TestTheGuardRefusesInternalAddressesUnlessAllowedAndSluicesOwnAlways(t *testing.T) {
	ctx := context.Background()
	none := mustGuard()
	private := mustGuard("10.0.0.0/8", "::ffff:192.168.7.0/120")
	everything := mustGuard("0.0.0.0/0", "::/0")
	if err := everything.Deny("Sluice's own NATS monitoring port", "127.0.0.1:8222", "nats.invalid:8222"); err != nil {
		t.Fatal(err)
	}
	if err := everything.Deny("this process's own HTTP server", ":8080"); err != nil {
		t.Fatal(err)
	}
	if err := everything.Deny("an address SLUICE_DENY_ADDRESSES names", "192.0.2.7:443"); err != nil {
		t.Fatal(err)
	}
	const notAllowed = "; SLUICE_ALLOW_NETWORKS does not allow it"
	tests := []struct {
		name  string
		guard *transfer.Guard
		addr  string
		want  string // "" is allowed
	}{
		{"a public IPv4 address", none, "192.0.2.1:443", ""},
		{"a public IPv6 address", none, "[2001:db8::1]:443", ""},
		{"a public address in NAT64 form", none, "[64:ff9b::c000:201]:443", ""},
		{"the NATS monitoring port on loopback", none, "127.0.0.1:8222", "connection to 127.0.0.1:8222 refused: it is loopback" + notAllowed},
		{"any loopback address", none, "127.3.2.1:80", "it is loopback" + notAllowed},
		{"IPv6 loopback", none, "[::1]:80", "connection to [::1]:80 refused: it is loopback" + notAllowed},
		{"IPv4-mapped loopback", none, "[::ffff:127.0.0.1]:80", "it is loopback" + notAllowed},
		{"IPv4-compatible loopback", none, "[::127.0.0.1]:80", "it holds 127.0.0.1, which is loopback" + notAllowed},
		{"NAT64 loopback", none, "[64:ff9b::7f00:1]:80", "it holds 127.0.0.1, which is loopback" + notAllowed},
		{"the unspecified address", none, "0.0.0.0:80", "it is unspecified (this host)" + notAllowed},
		{"the IPv6 unspecified address", none, "[::]:80", "it is unspecified (this host)" + notAllowed},
		{"the cloud metadata service", none, "169.254.169.254:80", "it is the cloud metadata service" + notAllowed},
		{"the cloud metadata service over IPv6", none, "[fd00:ec2::254]:80", "it is the cloud metadata service" + notAllowed},
		{"the cloud metadata service IPv4-mapped", none, "[::ffff:169.254.169.254]:80", "it is the cloud metadata service" + notAllowed},
		{"link-local", none, "169.254.1.1:80", "it is link-local" + notAllowed},
		{"IPv6 link-local with a zone", none, "[fe80::1%25eth0]:80", "it is link-local" + notAllowed},
		{"10/8", none, "10.1.2.3:80", "it is private" + notAllowed},
		{"172.16/12", none, "172.31.255.1:80", "it is private" + notAllowed},
		{"192.168/16", none, "192.168.1.1:80", "it is private" + notAllowed},
		{"IPv6 unique local", none, "[fd12::1]:80", "it is private" + notAllowed},
		{"carrier-grade NAT", none, "100.64.0.1:80", "it is carrier-grade NAT space" + notAllowed},
		{"multicast", none, "224.0.0.1:80", "it is multicast" + notAllowed},
		{"IPv6 multicast", none, "[ff02::1]:80", "it is multicast" + notAllowed},
		{"broadcast", none, "255.255.255.255:80", "it is reserved or broadcast" + notAllowed},
		{"an allowed private network", private, "10.9.9.9:80", ""},
		{"an allowed private network IPv4-mapped", private, "[::ffff:10.9.9.9]:80", ""},
		{"an allowed network written IPv4-mapped", private, "192.168.7.3:80", ""},
		{"a private network not allowed", private, "192.168.8.1:80", "it is private" + notAllowed},
		{"loopback not allowed beside a private network", private, "127.0.0.1:80", "it is loopback" + notAllowed},
		{"everything allowed", everything, "127.0.0.1:8223", ""},
		{"Sluice's own port whatever is allowed", everything, "127.0.0.1:8222", "connection to 127.0.0.1:8222 refused: it is Sluice's own NATS monitoring port, which no transfer may reach"},
		{"Sluice's own loopback port on another loopback address", everything, "127.0.0.2:8222", "it is Sluice's own NATS monitoring port"},
		{"Sluice's own loopback port over IPv6", everything, "[::1]:8222", "it is Sluice's own NATS monitoring port"},
		{"Sluice's own loopback port in NAT64 form", everything, "[64:ff9b::7f00:1]:8222", "it is Sluice's own NATS monitoring port"},
		{"a listener on every address, reached on loopback", everything, "127.0.0.1:8080", "it is this process's own HTTP server, which no transfer may reach"},
		{"a denied address", everything, "192.0.2.7:443", "it is an address SLUICE_DENY_ADDRESSES names, which no transfer may reach"},
		{"another port of a denied address", everything, "192.0.2.7:444", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u, err := url.Parse("tcp://" + tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			ap, err := netip.ParseAddrPort(strings.Replace(u.Host, "%25", "%", 1))
			if err != nil {
				t.Fatal(err)
			}
			err = tt.guard.Check(ctx, ap)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var re *transfer.RefusedError
			if !errors.As(err, &re) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want a *RefusedError saying %q", err, tt.want)
			}
		})
	}
	// A listener on every address stands for the port on each address of
	// this machine, not only on loopback.
	ifaddrs, _ := net.InterfaceAddrs()
	for _, ia := range ifaddrs {
		n, ok := ia.(*net.IPNet)
		a, ok2 := netip.AddrFromSlice(n.IP)
		if !ok || !ok2 {
			continue
		}
		if err := everything.Check(ctx, netip.AddrPortFrom(a.Unmap(), 8080)); err == nil {
			t.Errorf("%s:8080, an address of this machine, was allowed beside a listener on :8080", a)
		}
	}
	if _, err := transfer.NewGuard("10.0.0.0/33"); err == nil {
		t.Error("a bad CIDR was taken")
	}
	if err := mustGuard().Deny("x", "127.0.0.1"); err == nil {
		t.Error("a denied address without a port was taken")
	}
}

// counter is a server that counts the requests it gets: what a refused
// connection must never reach.
func counter(t *testing.T, addr string, body string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var hits atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		io.WriteString(w, body)
	}))
	if addr != "" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Skipf("cannot listen on %s: %v", addr, err)
		}
		srv.Listener.Close()
		srv.Listener = l
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestADTRSourceOnALoopbackPortIsRefusedUnlessLoopbackIsAllowed(t *testing.T) {
	// A NATS monitoring port, as far as the client can tell.
	monitor, hits := counter(t, "", `{"server_id":"NCXYZ","connections":[{"name":"sluice-scheduler"}]}`)
	src := monitor.URL + "/connz"
	ctx := context.Background()
	host := strings.TrimPrefix(monitor.URL, "http://")
	want := "copy " + src + ": connection to " + host + " refused: it is loopback; SLUICE_ALLOW_NETWORKS does not allow it"

	dst := filepath.Join(t.TempDir(), "connz")
	_, err := transfer.New(nil).Copy(ctx, src, fileURL(dst), transfer.CopyOptions{})
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || err.Error() != want {
		t.Fatalf("error %v (%s), want PERMANENT_REMOTE %q", err, transfer.KindOf(err), want)
	}
	checkAbsent(t, dst)
	// Nor as a destination, nor to stat or delete.
	up := filepath.Join(t.TempDir(), "up")
	writeFile(t, up, []byte("data"))
	_, err = transfer.New(nil).Copy(ctx, fileURL(up), monitor.URL+"/up", transfer.CopyOptions{})
	checkKind(t, err, dtr.ErrPermanentRemote)
	_, err = transfer.New(nil).Stat(ctx, src)
	checkKind(t, err, dtr.ErrPermanentRemote)
	checkKind(t, transfer.New(nil).Delete(ctx, src), dtr.ErrPermanentRemote)
	if n := hits.Load(); n != 0 {
		t.Fatalf("the refused server got %d requests", n)
	}
	// Allowed, it is storage like any other.
	if _, err := transfer.New(nil).WithGuard(loopback).Copy(ctx, src, fileURL(dst), transfer.CopyOptions{}); err != nil {
		t.Fatalf("with loopback allowed: %v", err)
	}
}

func TestARedirectToARefusedAddressIsRefusedAtThatHop(t *testing.T) {
	// 127.0.0.1 stands for the outside world (allowed); 127.0.0.2, also
	// loopback on Linux, for an internal service; monitor for Sluice's own
	// NATS monitoring port.
	inside, insideHits := counter(t, "127.0.0.2:0", "internal")
	monitor, monitorHits := counter(t, "127.0.0.1:0", `{"connections":[]}`)
	insideAddr := strings.TrimPrefix(inside.URL, "http://")
	monitorAddr := strings.TrimPrefix(monitor.URL, "http://")
	_, monitorPort, _ := net.SplitHostPort(monitorAddr)
	_, insidePort, _ := net.SplitHostPort(insideAddr)
	outside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		to := map[string]string{
			"/to-inside":    inside.URL + "/secret",
			"/to-mapped":    "http://[::ffff:127.0.0.2]:" + insidePort + "/secret",
			"/to-monitor":   monitor.URL + "/connz",
			"/to-localhost": "http://localhost:" + monitorPort + "/connz",
			"/to-metadata":  "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
			"/to-fine":      "/fine",
		}[r.URL.Path]
		if to != "" {
			http.Redirect(w, r, to, http.StatusTemporaryRedirect) // 307: DELETE stays DELETE
			return
		}
		io.WriteString(w, "fine")
	}))
	t.Cleanup(outside.Close)
	guard := mustGuard("127.0.0.1/32")
	if err := guard.Deny("Sluice's own NATS monitoring port", monitorAddr); err != nil {
		t.Fatal(err)
	}
	c := transfer.New(nil).WithGuard(guard)
	ctx := context.Background()
	tests := []struct {
		name, path string
		want       string // "" is success
	}{
		{"a redirect to an internal address", "/to-inside", "connection to " + insideAddr + " refused: it is loopback; SLUICE_ALLOW_NETWORKS does not allow it"},
		{"a redirect to an internal address IPv4-mapped", "/to-mapped", ":" + insidePort + " refused: it is loopback; SLUICE_ALLOW_NETWORKS does not allow it"},
		{"a redirect to Sluice's own port", "/to-monitor", "connection to " + monitorAddr + " refused: it is Sluice's own NATS monitoring port, which no transfer may reach"},
		{"a redirect to a name of Sluice's own port", "/to-localhost", ":" + monitorPort + " refused: it is Sluice's own NATS monitoring port"},
		{"a redirect to the cloud metadata service", "/to-metadata", "connection to 169.254.169.254:80 refused: it is the cloud metadata service; SLUICE_ALLOW_NETWORKS does not allow it"},
		{"a redirect to an allowed address is followed", "/to-fine", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := outside.URL + tt.path
			dst := filepath.Join(t.TempDir(), "f")
			_, copyErr := c.Copy(ctx, src, fileURL(dst), transfer.CopyOptions{})
			_, statErr := c.Stat(ctx, src)
			deleteErr := c.Delete(ctx, src)
			for op, err := range map[string]error{"copy": copyErr, "stat": statErr, "delete": deleteErr} {
				if tt.want == "" {
					if err != nil {
						t.Errorf("%s: %v", op, err)
					}
					continue
				}
				if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("%s: %v (%s), want PERMANENT_REMOTE saying %q", op, err, transfer.KindOf(err), tt.want)
				}
			}
			if tt.want != "" {
				checkAbsent(t, dst)
			}
		})
	}
	if n, m := insideHits.Load(), monitorHits.Load(); n != 0 || m != 0 {
		t.Fatalf("the refused servers got %d and %d requests", n, m)
	}
}

func TestANameIsCheckedAtTheAddressItResolvesTo(t *testing.T) {
	// localhost resolves to loopback: refused on every protocol, at the
	// address the name resolves to (checked when dialling, so a name that
	// answers differently later is checked again), even with loopback
	// allowed when the port is Sluice's own.
	ctx := context.Background()
	stores := protocolStores(t)
	for _, s := range stores {
		if s.name == "file" {
			continue
		}
		u, _ := url.Parse(s.base)
		_, port, _ := net.SplitHostPort(u.Host)
		named := strings.Replace(s.base, u.Host, "localhost:"+port, 1) + "/f"
		t.Run(s.name, func(t *testing.T) {
			_, err := s.client(nil).Stat(ctx, named)
			if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), ":"+port+" refused: it is loopback") {
				t.Fatalf("with loopback refused: %v (%s)", err, transfer.KindOf(err))
			}
			own := mustGuard("127.0.0.0/8", "::1")
			if err := own.Deny("Sluice's own NATS server", "127.0.0.1:"+port); err != nil {
				t.Fatal(err)
			}
			_, err = s.client(own).Stat(ctx, named)
			if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), ":"+port+" refused: it is Sluice's own NATS server") {
				t.Fatalf("Sluice's own port by name: %v (%s)", err, transfer.KindOf(err))
			}
			if _, err := s.client(loopback).Stat(ctx, named); err != nil {
				t.Fatalf("with loopback allowed: %v", err)
			}
		})
	}
}

func TestARequestThroughAProxyIsCheckedAtItsTarget(t *testing.T) {
	// The dialer sees the proxy's address only: the target is resolved and
	// checked before the request goes to the proxy.
	var proxied atomic.Int32
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxied.Add(1)
		io.WriteString(w, "from "+r.URL.Host)
	}))
	t.Cleanup(proxy.Close)
	pu, _ := url.Parse(proxy.URL)
	c := transfer.New(&http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}).WithGuard(mustGuard("127.0.0.1/32"))
	ctx := context.Background()
	_, err := c.Stat(ctx, "http://127.0.0.2:9/secret")
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "connection to 127.0.0.2:9 refused: it is loopback") {
		t.Fatalf("an internal target through the proxy: %v (%s)", err, transfer.KindOf(err))
	}
	if n := proxied.Load(); n != 0 {
		t.Fatalf("the proxy got %d requests for a refused target", n)
	}
	if _, err := c.Stat(ctx, "http://127.0.0.1:9/public"); err != nil || proxied.Load() != 1 {
		t.Fatalf("an allowed target through the proxy: %v, %d requests", err, proxied.Load())
	}
	// The proxy's own address is checked at the dial.
	c = transfer.New(&http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(pu)}}).WithGuard(mustGuard("127.0.0.2/32"))
	_, err = c.Stat(ctx, "http://127.0.0.2:9/secret")
	if transfer.KindOf(err) != dtr.ErrPermanentRemote || !strings.Contains(err.Error(), "connection to "+pu.Host+" refused: it is loopback") {
		t.Fatalf("a proxy on a refused address: %v (%s)", err, transfer.KindOf(err))
	}
}
