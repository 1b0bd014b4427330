package dtr

import (
	"strings"
	"testing"
)

func TestRedactURLHidesPasswordsAndQueryCredentials(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://host/f", "https://host/f"},
		{"FILE:///sess/./a", "FILE:///sess/./a"},
		{"https://alice@host/f", "https://alice@host/f"},
		{"https://alice:s3cr3t@host/f", "https://alice:xxxxx@host/f"},
		{"https://host/f?access_token=s3cr3t", "https://host/f?access_token=xxxxx"},
		{"https://host/f?part=1&ACCESS_TOKEN=s3cr3t&x=2", "https://host/f?part=1&ACCESS_TOKEN=xxxxx&x=2"},
		{"https://host/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAX%2F2026&X-Amz-Signature=s3cr3t&X-Amz-Security-Token=s3cr3t",
			"https://host/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=xxxxx&X-Amz-Signature=xxxxx&X-Amz-Security-Token=xxxxx"},
		{"https://acct.blob.example/c/f?sv=2024&se=2026&sig=s3cr3t", "https://acct.blob.example/c/f?sv=2024&se=2026&sig=xxxxx"},
		{"davs://dcache/f?authz=s3cr3t", "davs://dcache/f?authz=xxxxx"},
		{"https://host/f?AWSAccessKeyId=AKIA&Signature=s3cr3t&Expires=1", "https://host/f?AWSAccessKeyId=xxxxx&Signature=xxxxx&Expires=1"},
		{"https://host/f?access%5Ftoken=s3cr3t", "https://host/f?access%5Ftoken=xxxxx"},
		{"https://alice:s3cr3t@host:bad/f", "https://(not shown: it does not parse and may hold credentials)"},
		{"https://host:bad/f?token=s3cr3t", "https://host:bad/f?token=xxxxx"},
	}
	for _, tt := range tests {
		got := RedactURL(tt.in)
		if got != tt.want || strings.Contains(got, "s3cr3t") {
			t.Errorf("RedactURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestValidateURLNeverQuotesAQueryCredential(t *testing.T) {
	for _, u := range []string{
		"gopher://host/f?access_token=s3cr3t",
		"https:///f?access_token=s3cr3t",
		"https://host/f?access_token=s3cr3t&x=%zz\x7f",
		"s3://host/bucket?X-Amz-Signature=s3cr3t",
	} {
		err := ValidateURL(u)
		if err == nil {
			t.Errorf("%q: valid", u)
			continue
		}
		if strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("%q: error %q shows the credential", u, err)
		}
	}
}

func TestHoldsSecretQuery(t *testing.T) {
	for in, want := range map[string]bool{
		`https://h/f?access_token=x`:                 true,
		`{"source":"https://h/f?a=1\u0026sig=x"}`:    true,
		`https://h/f?Signature=x`:                    true,
		`https://h/f?part=1&x=2`:                     false,
		`{"source":"https://h/f","token":"nothing"}`: false,
	} {
		if got := HoldsSecretQuery([]byte(in)); got != want {
			t.Errorf("HoldsSecretQuery(%s) = %v, want %v", in, got, want)
		}
	}
}

func TestRedactTextHidesCredentialsOfURLsInAnyText(t *testing.T) {
	in := `failed to send to https://bob:s3cr3t@collector:4318/v1/traces?api_key=s3cr3t&x=1: 401; Get "http://h/f?access_token=s3cr3t": EOF`
	want := `failed to send to https://xxxxx@collector:4318/v1/traces?api_key=xxxxx&x=1: 401; Get "http://h/f?access_token=xxxxx": EOF`
	if got := RedactText(in); got != want {
		t.Fatalf("RedactText:\n%s\nwant\n%s", got, want)
	}
}
