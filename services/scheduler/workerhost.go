package scheduler

// The host a worker's heartbeat names, as the scheduler takes it: it is
// written into dtr.state and shown on the web page and by `sluice
// workers`, so only a plain host name or address is kept.

// maxHostLen is the longest host name DNS allows.
const maxHostLen = 253

// validWorkerHost reports whether a heartbeat's host is a plain host name
// or IP address: letters, digits, '.', '-', ':' (IPv6) and '_', at most
// 253 bytes.
func validWorkerHost(host string) bool {
	if host == "" || len(host) > maxHostLen {
		return false
	}
	for i := 0; i < len(host); i++ {
		switch c := host[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '-', c == ':', c == '_':
		default:
			return false
		}
	}
	return true
}
