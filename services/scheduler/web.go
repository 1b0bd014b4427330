package scheduler

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"time"
)

//go:embed web
var webFiles embed.FS

// Handler serves the scheduler's live web page at / and its data at
// /api/overview (the Overview as JSON).
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(webFiles, "web")
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /api/overview", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(s.mon.overview())
	})
	return mux
}

// Ready reports whether the scheduler has recovered its DTRs, takes input
// and its loop comes round: a loop stuck for stallAfter (a store that never
// answers) is not ready.
func (s *Service) Ready() bool {
	return s.ready.Load() && time.Since(time.Unix(0, s.looped.Load())) < stallAfter
}

// stallAfter is how long the scheduling loop may take over one round, which
// the tick keeps near 50 ms.
const stallAfter = 30 * time.Second
