// Package delivery is the delivery service: it moves the bytes of granted
// transfers (TRANSFER state) from source to a temporary destination,
// computing checksums while streaming and reporting progress, which renews
// the grant's lease.
package delivery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/nats-io/nats.go"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/scitag"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/worker"
)

// Config is the delivery service's configuration, read from
// SLUICE_DELIVERY_*.
type Config struct {
	Workers int `envconfig:"WORKERS" default:"11" desc:"concurrent transfers; at least maxdelivery + maxemergency"`
	// MaxInactivity ends a transfer that moved no data for this long with a
	// TRANSFER_SPEED error, which is retried (ARC: speedcontrol max_inact).
	MaxInactivity time.Duration `envconfig:"MAX_INACTIVITY" default:"5m" desc:"a transfer that moves no data for this long fails (TRANSFER_SPEED, retried)"`
	// MinSpeed, MinSpeedTime and MinAverageSpeed are the rest of ARC's
	// speedcontrol (see SpeedLimits).
	MinSpeed        float64       `envconfig:"MIN_SPEED" default:"0" desc:"a transfer slower than this many bytes/s over the last MIN_SPEED_TIME fails (TRANSFER_SPEED, retried); 0: off"`
	MinSpeedTime    time.Duration `envconfig:"MIN_SPEED_TIME" default:"5m" desc:"the window of MIN_SPEED; no speed is checked before a transfer has run this long"`
	MinAverageSpeed float64       `envconfig:"MIN_AVERAGE_SPEED" default:"0" desc:"a transfer whose average since its start falls below this many bytes/s fails (TRANSFER_SPEED, retried); 0: off"`
	// MaxFileSize bounds every source (transfer.CopyOptions.MaxSize); the
	// processors read it too, for QUERY_REPLICA and staging. 1 TiB is
	// more than any one file a site moves (the largest are a few hundred
	// GB), yet stops an endless source (a server that streams for ever)
	// before it fills most file systems.
	MaxFileSize int64 `envconfig:"MAX_FILE_SIZE" default:"1099511627776" desc:"largest file, in bytes, that is transferred or staged: a source known to be larger fails at QUERY_REPLICA, one of unknown size is cut off past it (PERMANENT_REMOTE, or LOCAL_FILE for a local source; not retried); also read by processors; 0: no limit"`
	// Client reaches storage: the one transfer client of the process,
	// with its file roots, credentials and outbound guard (internal/app
	// builds it); nil: public addresses only, no credentials, any path.
	Client *transfer.Client `ignored:"true"`
	// Meter takes the service's metrics (nil: the global meter provider's).
	Meter metric.Meter `ignored:"true"`
	// Heartbeat is how often the pool sends a heartbeat (SLUICE_HEARTBEAT,
	// shared; 0: worker.DefaultHeartbeat).
	Heartbeat time.Duration `ignored:"true"`
	// Checksum is the checksum type computed on the stream of a transfer
	// whose job expects none, or "none".
	Checksum string `envconfig:"CHECKSUM" default:"adler32" desc:"checksum computed while streaming a file whose job gives no expected checksum, for its record: adler32, md5, sha256 or crc32c; none computes none (a checksum the source states is still checked), and a local file copied to a local file is then copied by the kernel (copy_file_range, or a reflink where the file system shares blocks)"`
	// SciTags marks each transfer's requests for the network
	// (SLUICE_SCITAG_*); nil marks nothing.
	SciTags *scitag.Table `ignored:"true"`
}

// errTooSlow ends a transfer that broke a speed limit.
var errTooSlow = errors.New("too slow")

// Service is a running delivery service.
type Service struct {
	cfg    Config
	nc     *nats.Conn
	client *transfer.Client
	log    *slog.Logger
}

// New prepares a delivery service on nc.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) *Service {
	return &Service{cfg: cfg, nc: nc, client: cmp.Or(cfg.Client, transfer.New(nil)), log: log.With("service", "delivery")}
}

// Run serves transfer grants until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if typ := strings.ToLower(s.cfg.Checksum); typ != "" && typ != NoChecksum {
		if _, err := checksum.New(typ); err != nil {
			return fmt.Errorf("SLUICE_DELIVERY_CHECKSUM: %w", err)
		}
	}
	p, err := worker.NewPool(s.nc, dtr.StageDelivery, s.cfg.Workers, s.Handle, s.log, s.cfg.Meter)
	if err != nil {
		return err
	}
	p.Heartbeat = s.cfg.Heartbeat
	return p.Run(ctx)
}

// watchInactivity cancels a transfer whose byte count has not grown for
// MaxInactivity.
// watchSpeed checks the transfer against the speed limits every second
// (or more often for short limits) and ends it with errTooSlow, and the
// reason, when it breaks one.
func (s *Service) watchSpeed(ctx context.Context, cancel context.CancelCauseFunc, m *speedMeter) (stop func()) {
	l := m.limits
	if l.MaxInactivity <= 0 && l.MinSpeed <= 0 && l.MinAverageSpeed <= 0 {
		return func() {}
	}
	every := time.Second
	for _, d := range []time.Duration{l.MaxInactivity / 4, l.MinSpeedTime / 4} {
		if d > 0 {
			every = min(every, d)
		}
	}
	// A timer, not a goroutine of its own: most transfers end before
	// their first check.
	var mu sync.Mutex
	stopped := false
	var t *time.Timer
	check := func() {
		if ctx.Err() != nil {
			return
		}
		if err := m.Check(time.Now()); err != nil {
			cancel(fmt.Errorf("%w: %v", errTooSlow, err))
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(every)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(every, check)
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		t.Stop()
	}
}

// NoChecksum is the Checksum setting that computes none.
const NoChecksum = "none"

// Handle moves one file. The checksum type is the expected checksum's, else
// the configured one (Config.Checksum; empty: adler32), else none.
func (s *Service) Handle(ctx context.Context, g api.Grant, report func(int64, int64)) api.Result {
	d := *g.DTR
	typ := strings.ToLower(cmp.Or(s.cfg.Checksum, "adler32")) // the copy's checksums are keyed in lower case
	if d.Options.Checksum != "" {
		if t, _, err := dtr.ParseChecksum(d.Options.Checksum); err == nil {
			typ = t
		}
	}
	var types []string
	if typ != NoChecksum {
		types = []string{typ}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	ctx = transfer.WithSciTag(ctx, s.cfg.SciTags.For(&d))
	meter := newSpeedMeter(SpeedLimits{MinSpeed: s.cfg.MinSpeed, MinSpeedTime: s.cfg.MinSpeedTime,
		MinAverageSpeed: s.cfg.MinAverageSpeed, MaxInactivity: s.cfg.MaxInactivity}, time.Now())
	stop := s.watchSpeed(ctx, cancel, meter)
	defer stop()
	src := d.Source
	if d.TURL != "" {
		src = d.TURL // the staged copy
	}
	progress := func(b int64) {
		meter.Record(time.Now(), b)
		report(b, d.Size)
	}
	tpcType := typ
	if types == nil {
		tpcType = "" // the copy's default: it only asks the storages
	}
	dst := transfer.TempURLOf(&d) // the temporary name the copy is made under
	res, streamed, done := s.thirdParty(ctx, &d, src, dst, tpcType, progress)
	if done {
		return res
	}
	cr, err := s.client.Copy(ctx, src, dst, transfer.CopyOptions{
		ChecksumTypes: types,
		NoChecksum:    types == nil,
		// d.Size is what QUERY_REPLICA found (0: unknown), and the staged
		// copy has it too.
		ExpectedSize: d.Size,
		MaxSize:      s.cfg.MaxFileSize,
		Progress:     progress,
	})
	// Size only on success: the scheduler takes a result's size as the
	// file's, and the next attempt would expect the bytes a failed one
	// moved.
	res = api.Result{Bytes: cr.Bytes, Started: cr.Started, Ended: cr.Ended, TransferMethod: streamed}
	if err != nil {
		res.Error = failure(ctx, err, src)
		return res
	}
	res.Size, res.Checksum = cr.Bytes, cr.Checksums[typ]
	if types == nil && cr.SourceChecksum != "" {
		res.Checksum = cr.SourceChecksum // the one computed: the source's type
	}
	// Copy compares the checksum the source states (its Digest) with the
	// bytes streamed, and fails on a difference: one stated is one the
	// storage confirmed. A storage that keeps none (or refuses to say)
	// leaves the stream's own; a copy that computed none checked none.
	switch {
	case cr.SourceChecksum != "":
		res.ChecksumSource = dtr.ChecksumFromStorage
	case res.Checksum != "":
		res.ChecksumSource = dtr.ChecksumFromStream
	}
	return res
}

// failure is the failure of a transfer from src that ended with err.
func failure(ctx context.Context, err error, src string) *dtr.Failure {
	kind, text := transfer.KindOf(err), err.Error()
	if cause := context.Cause(ctx); errors.Is(cause, errTooSlow) {
		kind, text = dtr.ErrTransferSpeed, cause.Error()
	}
	f := &dtr.Failure{Kind: kind, Text: text, Location: dtr.LocationDestination}
	var te *transfer.Error
	if errors.As(err, &te) && te.URL == src || errors.Is(context.Cause(ctx), errTooSlow) {
		f.Location = dtr.LocationSource // a slow transfer: try another copy
	}
	return f
}
