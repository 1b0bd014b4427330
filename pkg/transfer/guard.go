package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A submitter chooses the URLs of a DTR, so without a check Sluice would
// connect wherever they point: to its own NATS server and its monitoring
// port, to the /metrics and /debug/pprof of its own HTTP server, to a
// cloud's metadata service, to anything on the site's private networks,
// directly or through a redirect. A Guard decides, at every connection,
// whether its address may be reached.

// Guard decides which addresses the outbound connections of a Client may
// reach (every protocol: HTTP and WebDAV, S3, xrootd). It checks the
// address actually dialled, after name resolution, so a name that
// resolves to a refused address (DNS rebinding included) is refused, and
// it checks every redirect hop, each being a connection of its own.
//
// Public addresses are allowed. Refused unless an allowed network holds
// them: loopback (127.0.0.0/8, ::1), unspecified (0.0.0.0/8, ::),
// link-local (169.254.0.0/16, fe80::/10) with the cloud metadata service
// (169.254.169.254, fd00:ec2::254), private (10.0.0.0/8, 172.16.0.0/12,
// 192.168.0.0/16, fc00::/7, fec0::/10), carrier-grade NAT
// (100.64.0.0/10), multicast, broadcast and reserved (240.0.0.0/4), and
// the IPv4-mapped, IPv4-compatible and NAT64 (64:ff9b::/96) IPv6 forms of
// all of these. Denied addresses (Deny) are refused whatever the allowed
// networks say.
//
// A nil *Guard is NewGuard(): public addresses only. Set a Guard up
// (Deny) before a Client uses it; it is then safe for concurrent use.
type Guard struct {
	allow []netip.Prefix
	deny  []*denied
}

// denied is one entry of a Guard's deny list: a port on a host, which is
// an address, a name (resolved when checked, the answer kept a minute) or
// this machine.
type denied struct {
	host string // as given, without brackets; "" is this machine
	port uint16
	why  string

	mu       sync.Mutex
	addrs    []netip.Addr // the host's addresses; this machine's too if local
	local    bool         // the host is this machine
	resolved time.Time
}

// refreshDenied is how long the addresses of a denied name, or of this
// machine, are kept before they are looked up again.
const refreshDenied = time.Minute

// retryDenied is how soon a denied name that did not resolve is looked up
// again.
const retryDenied = 5 * time.Second

// NewGuard returns a Guard that lets connections reach public addresses
// and the networks in allow: CIDRs ("10.0.0.0/8", "fd00::/8") or single
// addresses ("192.0.2.7"), empty entries ignored (SLUICE_ALLOW_NETWORKS).
// "0.0.0.0/0,::/0" allows every address.
func NewGuard(allow ...string) (*Guard, error) {
	g := &Guard{}
	for _, s := range allow {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := parseNetwork(s)
		if err != nil {
			return nil, err
		}
		g.allow = append(g.allow, p)
	}
	return g, nil
}

// parseNetwork parses a CIDR or a single address into a prefix of
// unmapped IPv4 or IPv6 addresses.
func parseNetwork(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("allowed network %q: want a CIDR such as 10.0.0.0/8 or an address", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("allowed network %q: want a CIDR such as 10.0.0.0/8 or an address", s)
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// Deny makes g refuse each host:port in hostports whatever the allowed
// networks say, naming why in the refusal: "it is <why>, which no
// transfer may reach". The host is an address or a name, resolved when a
// connection is checked (the answer kept a minute; a name that does not
// resolve denies nothing until it does, and is asked again every few
// seconds). A host that is this machine (none, as in ":8080", an
// unspecified, loopback or local address, or a name resolving to one)
// stands for the port on every address of this machine, since a server
// listening on one of them may listen on all. Call Deny before g is in
// use.
func (g *Guard) Deny(why string, hostports ...string) error {
	for _, hp := range hostports {
		hp = strings.TrimSpace(hp)
		if hp == "" {
			continue
		}
		host, portStr, err := net.SplitHostPort(hp)
		if err != nil {
			return fmt.Errorf("denied address %q: want host:port", hp)
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || port == 0 {
			return fmt.Errorf("denied address %q: want host:port with a port from 1 to 65535", hp)
		}
		d := &denied{host: host, port: uint16(port), why: why}
		g.deny = append(g.deny, d)
	}
	return nil
}

// RefusedError is a connection a Guard refused. It is a PERMANENT_REMOTE
// error: the address is refused the next time too.
type RefusedError struct {
	// Addr is the address that was to be dialled.
	Addr netip.AddrPort
	// Reason says why: "it is loopback; SLUICE_ALLOW_NETWORKS does not
	// allow it", "it is Sluice's own NATS monitoring port".
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("connection to %s refused: %s", e.Addr, e.Reason)
}

// Check returns nil if a connection to addr may be made, else a
// *RefusedError saying why not. A nil g is NewGuard().
func (g *Guard) Check(ctx context.Context, addr netip.AddrPort) error {
	a := addr.Addr().WithZone("").Unmap()
	inner := embedded(a)
	if g != nil {
		for _, d := range g.deny {
			if d.port == addr.Port() && (d.holds(ctx, a) || inner.IsValid() && d.holds(ctx, inner)) {
				return &RefusedError{Addr: addr, Reason: "it is " + d.why + ", which no transfer may reach"}
			}
		}
	}
	class, of := special(a), a
	if class == "" && inner.IsValid() {
		class, of = special(inner), inner
	}
	if class == "" {
		return nil
	}
	if g != nil {
		for _, p := range g.allow {
			if p.Contains(a) || (inner.IsValid() && p.Contains(inner)) {
				return nil
			}
		}
	}
	reason := "it is " + class
	if of != a {
		reason = fmt.Sprintf("it holds %s, which is %s", of, class)
	}
	return &RefusedError{Addr: addr, Reason: reason + "; SLUICE_ALLOW_NETWORKS does not allow it"}
}

// holds reports whether a is one of d's addresses.
func (d *denied) holds(ctx context.Context, a netip.Addr) bool {
	addrs, local := d.current(ctx)
	if local && (a.IsLoopback() || a.IsUnspecified()) {
		return true
	}
	for _, b := range addrs {
		if a == b {
			return true
		}
	}
	return false
}

// current returns d's addresses, and whether its host is this machine,
// looking them up again when they are older than refreshDenied. A host
// that is, or resolves to, a loopback, unspecified or local address is
// this machine: its addresses are all of this machine's.
func (d *denied) current(ctx context.Context) ([]netip.Addr, bool) {
	d.mu.Lock()
	if time.Since(d.resolved) < refreshDenied {
		defer d.mu.Unlock()
		return d.addrs, d.local
	}
	d.mu.Unlock()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(d.host); err == nil {
		addrs = []netip.Addr{a.Unmap().WithZone("")}
	} else if d.host != "" {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		found, err := net.DefaultResolver.LookupNetIP(lctx, "ip", d.host)
		cancel()
		if err != nil {
			// The last answer, if any, is kept; the name is asked again
			// in a few seconds.
			d.mu.Lock()
			defer d.mu.Unlock()
			d.resolved = time.Now().Add(retryDenied - refreshDenied)
			return d.addrs, d.local
		}
		for _, a := range found {
			addrs = append(addrs, a.Unmap().WithZone(""))
		}
	}
	mine := localAddrs()
	local := d.host == ""
	for _, a := range addrs {
		local = local || a.IsLoopback() || a.IsUnspecified() || slices.Contains(mine, a)
	}
	if local {
		addrs = append(addrs, mine...)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addrs, d.local, d.resolved = addrs, local, time.Now()
	return addrs, local
}

// localAddrs are the addresses of this machine's interfaces.
func localAddrs() []netip.Addr {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, ia := range ifaddrs {
		if n, ok := ia.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

// The address blocks a Guard refuses unless allowed, most specific first.
var specialBlocks = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("169.254.169.254/32"), "the cloud metadata service"},
	{netip.MustParsePrefix("fd00:ec2::254/128"), "the cloud metadata service"},
	{netip.MustParsePrefix("0.0.0.0/8"), "unspecified (this host)"},
	{netip.MustParsePrefix("::/128"), "unspecified (this host)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"},
	{netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"},
	{netip.MustParsePrefix("10.0.0.0/8"), "private"},
	{netip.MustParsePrefix("172.16.0.0/12"), "private"},
	{netip.MustParsePrefix("192.168.0.0/16"), "private"},
	{netip.MustParsePrefix("fc00::/7"), "private"},
	{netip.MustParsePrefix("fec0::/10"), "private (site-local)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "private (local-use NAT64)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "carrier-grade NAT space"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved or broadcast"},
}

// special returns the class of a refused-unless-allowed address, or ""
// for a public one.
func special(a netip.Addr) string {
	for _, b := range specialBlocks {
		if b.prefix.Contains(a) {
			return b.class
		}
	}
	return ""
}

var (
	nat64      = netip.MustParsePrefix("64:ff9b::/96")
	compatible = netip.MustParsePrefix("::/96")
)

// embedded returns the IPv4 address inside an IPv4-compatible (::a.b.c.d)
// or NAT64 (64:ff9b::a.b.c.d) IPv6 address, else the zero Addr. (An
// IPv4-mapped one, ::ffff:a.b.c.d, is unmapped before.)
func embedded(a netip.Addr) netip.Addr {
	if !a.Is6() || !(nat64.Contains(a) || compatible.Contains(a)) {
		return netip.Addr{}
	}
	b := a.As16()
	v4 := netip.AddrFrom4([4]byte(b[12:]))
	if compatible.Contains(a) && v4.As4()[0] == 0 {
		return netip.Addr{} // ::, ::1 and friends: not IPv4 addresses
	}
	return v4
}

// control is the net.Dialer ControlContext of a guarded dialer: it sees
// the resolved address of every connection, just before it is made.
func (g *Guard) control(ctx context.Context, network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return &RefusedError{Reason: fmt.Sprintf("address %q of a %s connection does not parse", address, network)}
	}
	return g.Check(ctx, ap)
}

// dialer returns the net.Dialer of connections that g guards.
func (g *Guard) dialer() *net.Dialer {
	return &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, ControlContext: g.control}
}

// resolve returns the addresses of host:port, checked: the first that g
// allows, else the first refusal. For protocols whose library dials on
// its own (xrootd), the address returned is the one to dial, so that the
// name is not resolved a second time. all makes a single refused address
// refuse the host (for a host that something else resolves again, such
// as a proxy).
func (g *Guard) resolve(ctx context.Context, host string, port uint16, all bool) (netip.AddrPort, error) {
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		addrs = []netip.Addr{a}
	} else {
		found, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err != nil {
			return netip.AddrPort{}, err
		}
		addrs = found
	}
	var first error
	var ok netip.AddrPort
	for _, a := range addrs {
		ap := netip.AddrPortFrom(a, port)
		if err := g.Check(ctx, ap); err != nil {
			if all {
				return netip.AddrPort{}, err
			}
			if first == nil {
				first = err
			}
			continue
		}
		if !ok.IsValid() {
			ok = ap
		}
	}
	if ok.IsValid() {
		return ok, nil
	}
	if first == nil {
		first = &net.DNSError{Err: "no address", Name: host, IsNotFound: true}
	}
	return netip.AddrPort{}, first
}

// isRefused reports whether err is a connection a Guard refused.
func isRefused(err error) (*RefusedError, bool) {
	var re *RefusedError
	return re, errors.As(err, &re)
}
