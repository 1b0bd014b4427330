package transfer

import (
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"
)

// digestChecksum returns "type:value" from the RFC 3230 Digest headers in
// h, preferring adler32, then md5, then sha-256; "" if none is usable.
// adler32 is hex (1–8 digits); md5 and sha-256 are base64 by the RFC, but
// hex is accepted too since some servers send it.
func digestChecksum(h http.Header) string {
	found := map[string]string{}
	for _, line := range h.Values("Digest") {
		for item := range strings.SplitSeq(line, ",") {
			alg, val, ok := strings.Cut(strings.TrimSpace(item), "=")
			if !ok {
				continue
			}
			typ, v := digestValue(strings.ToLower(strings.TrimSpace(alg)), strings.TrimSpace(val))
			if v != "" && found[typ] == "" {
				found[typ] = v
			}
		}
	}
	for _, typ := range []string{"adler32", "md5", "sha256"} {
		if v := found[typ]; v != "" {
			return typ + ":" + v
		}
	}
	return ""
}

// digestValue maps one Digest algorithm and value to a Sluice checksum type
// and lowercase hex value, or "" if it is not one Sluice uses or is
// malformed.
func digestValue(alg, val string) (typ, hexValue string) {
	switch alg {
	case "adler32":
		if len(val) == 0 || len(val) > 8 || !isHex(val) {
			return "", ""
		}
		return "adler32", strings.Repeat("0", 8-len(val)) + strings.ToLower(val)
	case "md5":
		return "md5", binaryValue(val, 16)
	case "sha-256", "sha256":
		return "sha256", binaryValue(val, 32)
	}
	return "", ""
}

// binaryValue decodes an n-byte digest written in base64 (padded or not)
// or hex, returning lowercase hex.
func binaryValue(val string, n int) string {
	if len(val) == 2*n && isHex(val) {
		return strings.ToLower(val)
	}
	b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(val, "="))
	if err != nil || len(b) != n {
		return ""
	}
	return hex.EncodeToString(b)
}

func isHex(s string) bool {
	for _, r := range s {
		if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f' || 'A' <= r && r <= 'F') {
			return false
		}
	}
	return true
}
