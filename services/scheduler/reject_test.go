package scheduler

import (
	"strings"
	"testing"
)

func TestARejectionQuotesTheMessageButNeverAURLPassword(t *testing.T) {
	long := `{"id":"x","source":"file:///a","destination":"file:///` + strings.Repeat("b", 1000) + `"}`
	tests := []struct {
		name, data, want string
	}{
		{"a message is quoted", `{"id":"x"}`, `{"id":"x"}`},
		{"up to 512 bytes", long, long[:512]},
		{"a user name alone is no secret", `{"source":"https://alice@h/f"}`, `{"source":"https://alice@h/f"}`},
		{"a password", `{"source":"https://alice:hunter2@h/f"}`, ""},
		{"a password after the first 512 bytes", long[:600] + `https://alice:hunter2@h/f`, ""},
		{"a password behind JSON's escaped slashes", `{"source":"https:\/\/alice:hunter2@h/f"}`, ""},
		{"a password behind a JSON escape of its @", `{"source":"https://alice:hunter2\u0040h/f"}`, ""},
		{"a password in a structured CloudEvent", `{"specversion":"1.0","data":{"replicas":["s3://KEY:SECRET\u0040h/b/k"]}}`, ""},
		{"a password in a message that is not JSON", `source=https://alice:hunter2@h/f`, ""},
		{"a password with a # (not encoded)", `{"source":"https://alice:s3cr#t@h/f"}`, ""},
		{"a password with a /", `{"source":"https://alice:pa/ss@h/f"}`, ""},
		{"a password with a ?", `{"source":"https://alice:wh?t@h/f"}`, ""},
		{"a password with a space", `{"source":"https://alice:two words@h/f"}`, ""},
		{"a password with a space in a message that is not JSON", `source=https://alice:two words@h/f`, ""},
		{"a port is no password", `{"source":"https://h:8443/f"}`, `{"source":"https://h:8443/f"}`},
		{"an access token in the query", `{"source":"https://h/f?access_token=s3cr3t"}`, ""},
		{"a presigned S3 URL behind JSON's escaped &", `{"source":"https://h/b/k?x-id=1\u0026X-Amz-Signature=abc"}`, ""},
		{"a query without credentials is quoted", `{"source":"https://h/f?part=2&x=1"}`, `{"source":"https://h/f?part=2&x=1"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rejectionPayload([]byte(tt.data)); got != tt.want {
				t.Fatalf("quoted %q, want %q", got, tt.want)
			}
		})
	}
}
