// Package securetest makes, for a test, what secure NATS logins need: TLS
// certificates, nkeys and operator-signed credentials, and runs real NATS
// servers (the embedded nats-server library, from a configuration file)
// that require them.
package securetest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// PKI is a CA and the certificates it signed, as PEM files in Dir, and a
// second CA that signed nothing of this.
type PKI struct {
	Dir                   string
	CA                    string // the CA's certificate
	ServerCert, ServerKey string // for 127.0.0.1, ::1 and localhost
	ClientCert, ClientKey string // a client certificate (CN sluice-client)
	OtherCA               string // another CA's certificate
	OtherCert, OtherKey   string // a client certificate of the other CA
	caCert                *x509.Certificate
	caKey                 *ecdsa.PrivateKey
}

// NewPKI makes a CA, a server and a client certificate, and another CA.
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir()}
	p.caCert, p.caKey, p.CA = makeCA(t, p.Dir, "ca")
	p.ServerCert, p.ServerKey = p.issue(t, p.caCert, p.caKey, "server", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "localhost"},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	p.ClientCert, p.ClientKey = p.issue(t, p.caCert, p.caKey, "client", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "sluice-client"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	otherCert, otherKey, other := makeCA(t, p.Dir, "other-ca")
	p.OtherCA = other
	p.OtherCert, p.OtherKey = p.issue(t, otherCert, otherKey, "other-client", &x509.Certificate{
		Subject:     pkix.Name{CommonName: "stranger"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return p
}

func nextSerial() *big.Int {
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		panic(err)
	}
	return n
}

func makeCA(t testing.TB, dir, name string) (*x509.Certificate, *ecdsa.PrivateKey, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: nextSerial(), Subject: pkix.Name{CommonName: "sluice test " + name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, name+".pem")
	writePEM(t, file, "CERTIFICATE", der)
	return cert, key, file
}

// issue signs tmpl with the CA and writes name.pem and name-key.pem.
func (p *PKI) issue(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, tmpl *x509.Certificate) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = nextSerial()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(p.Dir, name+".pem"), filepath.Join(p.Dir, name+"-key.pem")
	writePEM(t, cert, "CERTIFICATE", der)
	writePEM(t, key, "PRIVATE KEY", kder)
	return cert, key
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Nkey makes an nkey user and writes its seed to a file in dir.
func Nkey(t testing.TB, dir string) (seedFile, public string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	public, _ = kp.PublicKey()
	seedFile = filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return seedFile, public
}

// Operator is an operator and one account with JetStream, for a server in
// operator (JWT) mode with a memory resolver preloaded with the account.
type Operator struct {
	operator nkeys.KeyPair
	account  nkeys.KeyPair
	opJWT    string
	accJWT   string
	sys      string // the system account's public key
	sysJWT   string
	// Account is the account's public key.
	Account string
}

// NewOperator makes an operator and an account it signed.
func NewOperator(t testing.TB) *Operator {
	t.Helper()
	o := &Operator{}
	var err error
	if o.operator, err = nkeys.CreateOperator(); err != nil {
		t.Fatal(err)
	}
	opPub, _ := o.operator.PublicKey()
	sys, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	o.sys, _ = sys.PublicKey()
	sc := jwt.NewAccountClaims(o.sys)
	sc.Name = "SYS"
	if o.sysJWT, err = sc.Encode(o.operator); err != nil {
		t.Fatal(err)
	}
	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "sluice-test"
	oc.SystemAccount = o.sys
	if o.opJWT, err = oc.Encode(o.operator); err != nil {
		t.Fatal(err)
	}
	if o.account, err = nkeys.CreateAccount(); err != nil {
		t.Fatal(err)
	}
	o.Account, _ = o.account.PublicKey()
	ac := jwt.NewAccountClaims(o.Account)
	ac.Name = "SLUICE"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
	if o.accJWT, err = ac.Encode(o.operator); err != nil {
		t.Fatal(err)
	}
	return o
}

// Creds makes a user of the account named name (empty: none) that may not
// subscribe to the default inboxes (_INBOX.>), and writes its credentials
// file (jwt.FormatUserConfig) in dir.
func (o *Operator) Creds(t testing.TB, dir, name string) (credsFile, public string) {
	t.Helper()
	return o.CredsAllowed(t, dir, name, nil, nil)
}

// CredsAllowed is Creds for a user that may publish only on publish and
// subscribe only on subscribe (nil: anything but the default inboxes).
func (o *Operator) CredsAllowed(t testing.TB, dir, name string, publish, subscribe []string) (credsFile, public string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	public, _ = kp.PublicKey()
	uc := jwt.NewUserClaims(public)
	uc.Name = name
	uc.Permissions.Sub.Deny.Add("_INBOX.>")
	uc.Permissions.Pub.Allow.Add(publish...)
	uc.Permissions.Sub.Allow.Add(subscribe...)
	tok, err := uc.Encode(o.account)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	b, err := jwt.FormatUserConfig(tok, seed)
	if err != nil {
		t.Fatal(err)
	}
	credsFile = filepath.Join(dir, "user-"+public[:8]+".creds")
	if err := os.WriteFile(credsFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return credsFile, public
}

// Conf is the part of a server's configuration file for this operator.
func (o *Operator) Conf() string {
	return fmt.Sprintf("operator: %q\nsystem_account: %s\nresolver: MEMORY\nresolver_preload: {\n  %s: %q\n  %s: %q\n}\n",
		o.opJWT, o.sys, o.Account, o.accJWT, o.sys, o.sysJWT)
}

// TLSConf is the tls block of a server that requires TLS with the PKI's
// server certificate and, if verify, a client certificate of its CA.
func (p *PKI) TLSConf(verify bool) string {
	return fmt.Sprintf("tls {\n  cert_file: %q\n  key_file: %q\n  ca_file: %q\n  verify: %v\n  timeout: 5\n}\n",
		p.ServerCert, p.ServerKey, p.CA, verify)
}

// NoDefaultInbox are a user's permissions that keep it from nats.go's
// default inboxes: a connection without its own inbox prefix gets no
// replies.
const NoDefaultInbox = `permissions: { subscribe: { deny: ["_INBOX.>"] } }`

// Server runs a NATS server with JetStream (stored in a temporary
// directory) on a free port of 127.0.0.1 from the configuration text conf,
// until the test ends. Its client URL is tls:// when conf has a tls block.
func Server(t testing.TB, conf string) (*server.Server, string) {
	t.Helper()
	dir := t.TempDir()
	full := fmt.Sprintf("host: 127.0.0.1\nport: -1\nhttp_port: 0\njetstream { store_dir: %q }\n%s", filepath.Join(dir, "js"), conf)
	file := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(file, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("NATS configuration: %v\n%s", err, full)
	}
	opts.NoSigs, opts.NoLog = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("NATS server not ready")
	}
	t.Cleanup(ns.Shutdown)
	url := ns.ClientURL()
	if strings.Contains(conf, "tls {") {
		url = strings.Replace(url, "nats://", "tls://", 1)
	}
	return ns, url
}
