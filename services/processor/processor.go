// Package processor is the pre- and post-processing service. Pre-processing
// checks the source (QUERY_REPLICA: it exists, its size) and the destination
// (PRE_CLEAN: an existing one is deleted with overwrite, refused without),
// and stages a source that asks for it (STAGE_PREPARE: a copy in the
// staging area, pinned until release). Post-processing releases a staged
// copy (RELEASE_REQUEST), and (REGISTER_REPLICA) verifies the delivered
// file's checksum and renames it from its temporary name to the
// destination, or, after a failed or cancelled transfer, deletes what was
// left.
package processor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/checksum"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
	"github.com/sluice-dtr/sluice/pkg/worker"
)

// Config is the processor's configuration, read from SLUICE_PROCESSOR_*.
type Config struct {
	PreWorkers  int `envconfig:"PRE_WORKERS" default:"22" desc:"concurrent pre-processing grants; at least the slots of its two states (2 × (maxprocessor + maxemergency))"`
	PostWorkers int `envconfig:"POST_WORKERS" default:"11" desc:"concurrent post-processing grants; at least maxprocessor + maxemergency"`
	// Client reaches storage: the one transfer client of the process,
	// with its file roots, credentials and outbound guard (internal/app
	// builds it); nil: public addresses only, no credentials, any path.
	Client *transfer.Client `ignored:"true"`
	// CacheDir is the cache of downloads (SLUICE_CACHE_DIR, shared with
	// the scheduler's setting); empty: no cache.
	CacheDir      string `ignored:"true"`
	CacheMaxBytes int64  `envconfig:"CACHE_MAX_BYTES" default:"0" desc:"clean the cache (least recently used first) down to this many bytes; 0: no limit"`
	// CacheCleanEvery is how often the cache is cleaned (default 30 s), and
	// CacheMinAge how long an entry is kept after it was last used (default
	// 10 min), so that a DTR that found it can still link it.
	CacheCleanEvery  time.Duration `ignored:"true"`
	CacheMinAge      time.Duration `ignored:"true"`
	CacheLockTimeout time.Duration `envconfig:"CACHE_LOCK_TIMEOUT" default:"15m" desc:"a cache lock older than this is stale (its downloader died) and is broken"`
	StageDir         string        `envconfig:"STAGE_DIR" desc:"staging area for sources with the stage option; delivery reads the copies, so it must be shared with every deliverer (default: the temporary dir/sluice-stage)"`
	// Meter takes the service's metrics (nil: the global meter provider's).
	Meter metric.Meter `ignored:"true"`
	// Heartbeat is how often each pool sends a heartbeat
	// (SLUICE_HEARTBEAT, shared; 0: worker.DefaultHeartbeat).
	Heartbeat time.Duration `ignored:"true"`
	// MaxFileSize is the largest source (SLUICE_DELIVERY_MAX_FILE_SIZE,
	// shared with delivery): a larger one fails QUERY_REPLICA, and a
	// staging copy stops past it. 0: no limit.
	MaxFileSize int64 `ignored:"true"`
	// VerifyOnDisk has post-processing read a delivered local file back
	// and hash it again, against what delivery computed on the stream.
	VerifyOnDisk bool `envconfig:"VERIFY_ON_DISK" default:"false" desc:"read every delivered file:// destination back and hash it again before it is put in place, to catch damage after delivery hashed the bytes it wrote (a second pass over the bytes); off: the checksum computed while streaming is the one checked"`
}

// defaultCacheLockTimeout is CacheLockTimeout's default, for a Config
// built in code.
var defaultCacheLockTimeout, _ = time.ParseDuration(tagDefault("CacheLockTimeout"))

// tagDefault returns the default tag of Config's field: the one place a
// default is written, read here too for a Config built in code.
func tagDefault(field string) string {
	f, _ := reflect.TypeFor[Config]().FieldByName(field)
	return f.Tag.Get("default")
}

// StageDirOrDefault returns the staging area.
func (c Config) StageDirOrDefault() string { return c.stageDir() }

// stageDir returns the staging area.
func (c Config) stageDir() string {
	if c.StageDir != "" {
		return c.StageDir
	}
	return filepath.Join(os.TempDir(), "sluice-stage")
}

// Service is a running processor.
type Service struct {
	cfg    Config
	nc     *nats.Conn
	client *transfer.Client
	log    *slog.Logger
	// checking serialises this process's cache checks (several grants of
	// one message run at once, often for the same source).
	checking sync.Mutex
}

// New prepares a processor on nc.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) *Service {
	return &Service{cfg: cfg, nc: nc, client: cmp.Or(cfg.Client, transfer.New(nil)), log: log.With("service", "processor")}
}

// Run serves pre- and post-processing grants until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if s.cfg.CacheDir != "" {
		go s.keepCacheClean(ctx, cmp.Or(s.cfg.CacheCleanEvery, 30*time.Second))
	}
	pre, err := worker.NewPool(s.nc, dtr.StagePre, s.cfg.PreWorkers, s.Handle, s.log, s.cfg.Meter)
	if err != nil {
		return err
	}
	post, err := worker.NewPool(s.nc, dtr.StagePost, s.cfg.PostWorkers, s.Handle, s.log, s.cfg.Meter)
	if err != nil {
		return err
	}
	pre.Heartbeat, post.Heartbeat = s.cfg.Heartbeat, s.cfg.Heartbeat
	// One micro service for the process, its instance id the worker id of
	// both pools.
	shown, err := worker.Show(s.nc, pre, post)
	if err != nil {
		return err
	}
	defer shown.Stop()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return pre.Run(ctx) })
	g.Go(func() error { return post.Run(ctx) })
	return g.Wait()
}

// Handle does the work of one processing grant.
func (s *Service) Handle(ctx context.Context, g api.Grant, report func(int64, int64)) api.Result {
	var res api.Result
	var err error
	switch g.State {
	case dtr.QueryingReplica:
		res, err = s.queryReplica(ctx, *g.DTR)
		if err == nil && g.Then != nil && g.Then.State == dtr.PreCleaning {
			res.Then = s.chainedPreClean(ctx, g, res)
		}
	case dtr.PreCleaning:
		err = s.preClean(ctx, *g.DTR)
	case dtr.StagingPreparing:
		res, err = s.stage(ctx, g, report)
	case dtr.CheckingCache:
		res, err = s.checkCache(g)
	case dtr.ProcessingCache:
		res, err = s.processCache(ctx, g)
	case dtr.ReleasingRequest:
		err = s.release(ctx, *g.DTR)
	case dtr.RegisteringReplica:
		if g.Cleanup {
			err = s.cleanup(ctx, *g.DTR)
		} else {
			res, err = s.finalise(ctx, *g.DTR)
		}
	default:
		err = &transfer.Error{Kind: dtr.ErrInternalLogic, Op: "process", URL: g.DTR.Source,
			Err: fmt.Errorf("the processor does not handle state %s", g.State)}
	}
	if err != nil {
		res.Error = &dtr.Failure{Kind: transfer.KindOf(err), Text: err.Error(), Location: failingEnd[g.State]}
	}
	return res
}

// chainedPreClean does the pre-clean a chained QUERY_REPLICA grant asks
// for once its query succeeded, on the DTR as the query left it (the
// scheduler records the size found before it applies the pre-clean), and
// returns its outcome under the grant id the grant named. A pre-clean
// stopped half way (the pool stopping, the scheduler's stop, the lease's
// fence) returns none: the scheduler then queues the DTR for PRE_CLEAN
// as it would after the query alone.
func (s *Service) chainedPreClean(ctx context.Context, g api.Grant, queried api.Result) *api.Result {
	d := *g.DTR
	d.Size = queried.Size
	then := &api.Result{DTR: d.ID, Grant: g.Then.Grant, State: g.Then.State}
	if err := s.preClean(ctx, d); err != nil {
		if ctx.Err() != nil || transfer.IsLeaseLost(err) {
			return nil
		}
		then.Error = &dtr.Failure{Kind: transfer.KindOf(err), Text: err.Error(), Location: failingEnd[dtr.PreCleaning]}
	}
	return then
}

// failingEnd is the end of the transfer a failure in each state is about.
var failingEnd = map[dtr.State]string{
	dtr.ProcessingCache:    dtr.LocationDestination,
	dtr.QueryingReplica:    dtr.LocationSource,
	dtr.StagingPreparing:   dtr.LocationSource,
	dtr.PreCleaning:        dtr.LocationDestination,
	dtr.RegisteringReplica: dtr.LocationDestination,
}

// queryReplica checks that the source exists and learns its size.
func (s *Service) queryReplica(ctx context.Context, d dtr.DTR) (api.Result, error) {
	info, err := s.client.Stat(ctx, d.Source)
	if err != nil {
		return api.Result{}, err
	}
	if !info.Exists {
		kind := dtr.ErrPermanentRemote
		if strings.HasPrefix(d.Source, "file:") {
			kind = dtr.ErrLocalFile
		}
		return api.Result{}, &transfer.Error{Kind: kind, Op: "query replica", URL: d.Source,
			Err: fmt.Errorf("source does not exist")}
	}
	if err := transfer.CheckMaxSize("query replica", d.Source, info.Size, s.cfg.MaxFileSize); err != nil {
		return api.Result{}, err // not retried: the limit and the file stay
	}
	return api.Result{Size: max(info.Size, 0)}, nil
}

// preClean refuses an existing destination unless overwrite is set, then
// makes the destination's parent directories, unless it is a local file:
// delivery makes those as it writes the file. An existing destination is
// never deleted here: it is replaced when the new file is put in place (a
// rename, or the PUT of an http(s) or S3 destination), so that a pre-clean
// that runs late (its processor frozen past its lease) cannot delete a
// file that a later attempt of the same DTR has finished.
func (s *Service) preClean(ctx context.Context, d dtr.DTR) error {
	info, err := s.client.Stat(ctx, d.Destination)
	if err != nil {
		return err
	}
	if info.Exists && !d.Options.Overwrite {
		return &transfer.Error{Kind: dtr.ErrPermanentRemote, Op: "pre-clean", URL: d.Destination,
			Err: fmt.Errorf("destination exists and overwrite is not set")}
	}
	if strings.HasPrefix(d.Destination, "file:") {
		return nil
	}
	return s.client.MakeParents(ctx, d.Destination)
}

// finalise verifies the delivered file and puts it in place. The
// checksum delivery computed while streaming is what is checked: it must
// match the expected value, if the job gave one. A file:// destination is
// read back and hashed again on disk only with VerifyOnDisk (or when the
// stream's checksum is not of the expected type, so that there is nothing
// else to compare); the copy's bytes are otherwise read once, by delivery.
// A remote destination whose protocol can state the checksum it keeps
// (HTTP's Digest) is asked for it, and that is compared with delivery's
// (storageChecksum; the result then says the storage confirmed it). A
// mismatch deletes the file and is a TRANSFER_SPEED error, as in ARC; the
// scheduler copies the file afresh once, and a second mismatch of the
// expected checksum fails the DTR for good.
func (s *Service) finalise(ctx context.Context, d dtr.DTR) (api.Result, error) {
	tmp := transfer.TempURLOf(&d)
	got := d.Checksum
	want := d.Options.Checksum
	local := strings.HasPrefix(tmp, "file:")
	source := ""
	switch {
	case local && (s.cfg.VerifyOnDisk || want != "" && !checksum.SameType(want, d.Checksum)):
		sum, err := s.checksumOnDisk(ctx, d, tmp)
		if errors.Is(err, fs.ErrNotExist) {
			// No temporary file (looked for only now: a stat of each
			// file cost a tenth of post-processing).
			if done, err := s.alreadyInPlace(ctx, d, tmp); err != nil || done {
				return api.Result{Checksum: d.Checksum}, err
			}
		}
		if err != nil {
			return api.Result{}, err
		}
		got = sum
	case !local && d.Checksum != "":
		var err error
		if source, err = s.storageChecksum(ctx, d, tmp); err != nil {
			_ = s.client.Delete(ctx, tmp)
			return api.Result{}, err
		}
	}
	if want != "" && !checksum.Equal(want, got) {
		_ = s.client.Delete(ctx, tmp)
		return api.Result{}, &transfer.Error{Kind: dtr.ErrTransferSpeed, Op: "verify", URL: d.Destination,
			Err: fmt.Errorf("checksum mismatch: expected %s, got %s", want, got)}
	}
	if tmp != d.Target() {
		// Into place, replacing what is there: the destination, or the
		// cache entry that PROCESS_CACHE then links to it.
		if err := s.client.Rename(ctx, tmp, d.Target()); err != nil {
			// The temporary file is looked for only now.
			if !local || errors.Is(err, fs.ErrNotExist) {
				if done, ierr := s.alreadyInPlace(ctx, d, tmp); ierr == nil && done {
					return api.Result{Checksum: d.Checksum}, nil
				}
			}
			return api.Result{}, err
		}
	}
	return api.Result{Checksum: got, ChecksumSource: source}, nil
}

// checksumOnDisk hashes the delivered file at tmp again, of the expected
// checksum's type, else of delivery's, else adler32, and compares it with
// what delivery computed while streaming: a difference deletes the file
// and is a TRANSFER_SPEED error.
func (s *Service) checksumOnDisk(ctx context.Context, d dtr.DTR, tmp string) (string, error) {
	typ := "adler32"
	if d.Options.Checksum != "" {
		typ, _, _ = dtr.ParseChecksum(d.Options.Checksum)
	} else if t, _, err := dtr.ParseChecksum(d.Checksum); err == nil {
		typ = t
	}
	sum, err := s.client.Checksum(ctx, tmp, typ)
	if err != nil {
		return "", err
	}
	if d.Checksum != "" && checksum.SameType(d.Checksum, sum) && !checksum.Equal(d.Checksum, sum) {
		_ = s.client.Delete(ctx, tmp)
		return "", &transfer.Error{Kind: dtr.ErrTransferSpeed, Op: "verify", URL: d.Destination,
			Err: fmt.Errorf("checksum mismatch: delivery computed %s, the file on disk has %s", d.Checksum, sum)}
	}
	return sum, nil
}

// storageChecksum asks the storage a remote file was written to for the
// checksum it keeps of it, where its protocol may say one (HTTP's
// Digest), and compares it with what delivery computed on the stream. It
// returns dtr.ChecksumFromStorage when the storage confirmed it, "" when
// the storage said none of that type (a storage without checksums), and
// a TRANSFER_SPEED error, as a mismatch on disk is, when it differs. A
// failure to ask is not the file's: the rename that follows, or the
// check after it, reports a file that is not there.
func (s *Service) storageChecksum(ctx context.Context, d dtr.DTR, tmp string) (string, error) {
	u, err := url.Parse(tmp)
	if err != nil {
		return "", nil
	}
	if scheme, ok := dtr.SchemeOf(u.Scheme); !ok || !scheme.StatesChecksums {
		return "", nil
	}
	info, err := s.client.Stat(ctx, tmp)
	if err != nil || !info.Exists || info.Checksum == "" || !checksum.SameType(info.Checksum, d.Checksum) {
		return "", nil
	}
	if !checksum.Equal(info.Checksum, d.Checksum) {
		return "", &transfer.Error{Kind: dtr.ErrTransferSpeed, Op: "verify", URL: d.Destination,
			Err: fmt.Errorf("checksum mismatch: delivery sent %s, the storage has %s", d.Checksum, info.Checksum)}
	}
	return dtr.ChecksumFromStorage, nil
}

// alreadyInPlace reports whether an earlier try of this post-processing
// step already renamed the file into place (its result was lost, say, when
// the scheduler restarted): the temporary file is gone and the destination
// holds what delivery computed (for a remote one: as many bytes as
// delivery wrote, and the checksum in its Digest header if it sends one).
func (s *Service) alreadyInPlace(ctx context.Context, d dtr.DTR, tmp string) (bool, error) {
	if tmp == d.Target() {
		return false, nil
	}
	if info, err := s.client.Stat(ctx, tmp); err != nil || info.Exists {
		return false, err
	}
	// With no checksum from delivery (SLUICE_DELIVERY_CHECKSUM=none) a
	// local file, like a remote one, is judged by its size.
	if !strings.HasPrefix(tmp, "file:") || d.Checksum == "" {
		info, err := s.client.Stat(ctx, d.Target())
		if err != nil || !info.Exists || info.Size != d.Bytes {
			return false, err
		}
		if info.Checksum != "" && checksum.SameType(info.Checksum, d.Checksum) {
			return checksum.Equal(info.Checksum, d.Checksum), nil
		}
		return true, nil
	}
	typ, _, err := dtr.ParseChecksum(d.Checksum)
	if err != nil {
		return false, nil
	}
	sum, err := s.client.Checksum(ctx, d.Target(), typ)
	if err != nil {
		return false, nil // not there: the verification below reports the missing file
	}
	return checksum.Equal(sum, d.Checksum), nil
}

// cleanup removes what a failed or cancelled transfer left: the temporary
// file of its grant, or for a destination written in place (http(s), S3),
// the destination itself, which holds that attempt's bytes if anything
// (pre-cleaning made sure it was not there before, or overwrite allows it
// to go). The delete asks the grant's fence: a cleanup whose lease may
// have run out deletes nothing, since a later attempt may have finished.
//
// An S3 object appears only when its upload completes, so a failed upload
// left nothing; only a lost one (its worker gone) may have completed. With
// overwrite the object there is either the one that was there before or
// a whole copy of this source, which the retry replaces: it is kept. A
// failed attempt never deletes the final key of a destination that may
// hold something not its own.
func (s *Service) cleanup(ctx context.Context, d dtr.DTR) error {
	if d.Options.Overwrite && transfer.AppearsWhole(d.Destination) {
		return nil
	}
	return s.client.Delete(ctx, transfer.TempURLOf(&d))
}

// stage copies the source into the staging area, where it stays, pinned,
// until release; the copy's URL is the DTR's TURL, which delivery reads.
// Each staging grant writes names of its own, "<grant>.part" renamed to
// "<grant>" when complete (grant ids are "<dtr id>.<n>"), so a TURL always
// names a whole file, and a staging grant that runs late (its processor
// frozen past its lease) touches nothing of a later one's.
func (s *Service) stage(ctx context.Context, g api.Grant, report func(int64, int64)) (api.Result, error) {
	d := *g.DTR
	dir := s.cfg.stageDir()
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return api.Result{}, &transfer.Error{Kind: dtr.ErrLocalFile, Op: "stage", URL: d.Source,
			Err: fmt.Errorf("make the staging area: %w", err)}
	}
	staged := (&url.URL{Scheme: "file", Path: filepath.Join(dir, stagedName(d.ID.String(), g.ID))}).String()
	part := staged + ".part"
	cr, err := s.client.Copy(ctx, d.Source, part, transfer.CopyOptions{
		Progress: func(b int64) { report(b, d.Size) },
		// As delivery's: the size QUERY_REPLICA found, and the site's limit.
		ExpectedSize: d.Size, MaxSize: s.cfg.MaxFileSize,
		// Delivery computes the checksum when it reads the staged copy;
		// one the source states is still checked.
		NoChecksum: true,
	})
	if err != nil {
		return api.Result{}, err // Copy removed what it wrote, unless fenced
	}
	if err := s.client.Rename(ctx, part, staged); err != nil {
		return api.Result{}, err
	}
	return api.Result{Size: cr.Bytes, TURL: staged}, nil
}

// stagedName is the name in the staging area of a DTR's copy made under
// a grant: the grant id, which begins with the DTR's id.
func stagedName(id, grant string) string {
	if !strings.HasPrefix(grant, id+".") || strings.ContainsAny(grant, `/\`) {
		return id // not a grant of this DTR's: the one name it may have
	}
	return grant
}

// release removes every staged copy of a DTR, whole or partial, whichever
// grant made it. Only the staging area is touched, whatever the DTR's TURL
// says; a copy already gone is released.
func (s *Service) release(ctx context.Context, d dtr.DTR) error {
	dir := s.cfg.stageDir()
	id := d.ID.String()
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return &transfer.Error{Kind: dtr.ErrLocalFile, Op: "release", URL: d.Source, Err: err}
	}
	for _, e := range entries {
		if n := e.Name(); n == id || strings.HasPrefix(n, id+".") {
			if err := s.client.Delete(ctx, (&url.URL{Scheme: "file", Path: filepath.Join(dir, n)}).String()); err != nil {
				return err
			}
		}
	}
	return nil
}
