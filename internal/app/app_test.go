package app

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
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
