package delivery

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-dtr/sluice/pkg/api"
	"github.com/sluice-dtr/sluice/pkg/dtr"
	"github.com/sluice-dtr/sluice/pkg/transfer"
)

// A transfer between two HTTP(S) or WebDAV storages is, unless the DTR
// says never, first asked of the storages themselves (HTTP third-party
// copy): the destination is asked to pull from the source; if it refuses
// third-party copy, the source is asked to push to the destination; if it
// refuses too, the bytes are streamed through this deliverer (tpc auto,
// the default) or the transfer fails for good (tpc only). Pull comes first
// because the destination is where the file is written and verified, and
// it is what FTS3 and most WLCG storages do by default; push is there for
// a destination that takes PUT but does not copy itself (a plain WebDAV
// server beside a grid storage). A copy that was made and failed is not
// streamed again: it is retried as any failed transfer is.

// thirdPartyPlan is the order in which the modes are tried.
var thirdPartyPlan = []struct {
	mode   transfer.ThirdPartyMode
	method string
	end    string // the storage asked, for messages
}{
	{transfer.ThirdPartyPull, dtr.TransferPull, dtr.LocationDestination},
	{transfer.ThirdPartyPush, dtr.TransferPush, dtr.LocationSource},
}

// maxWhy is the most a DTR keeps of why its storages refused.
const maxWhy = 1024

// thirdParty makes the transfer of d, from src to dst (its temporary
// name), as a third-party copy when its TPC option and its URLs allow it. done says the result is the transfer's
// (made, failed, or refused for good); otherwise the bytes are to be
// streamed, and streamed is the result's TransferMethod.
func (s *Service) thirdParty(ctx context.Context, d *dtr.DTR, src, dst, typ string, progress func(int64)) (res api.Result, streamed string, done bool) {
	mode := d.Options.TPC
	if mode == dtr.TPCNever {
		return res, dtr.TransferStreamed, false
	}
	if !transfer.CanThirdPartyCopy(src, dst) {
		if mode != dtr.TPCOnly {
			return res, dtr.TransferStreamed, false
		}
		why := fmt.Sprintf("tpc is only, but a third-party copy needs http, https, dav or davs at both ends: this transfer is from %s to %s", schemeOf(src), schemeOf(dst))
		if d.TURL != "" {
			why += " (the staged copy of the source)"
		}
		return s.refused(ctx, d, why), "", true
	}
	var refusals []string
	for _, step := range thirdPartyPlan {
		tr, err := s.client.ThirdPartyCopy(ctx, src, dst, transfer.ThirdPartyOptions{
			Mode: step.mode, Progress: progress, ExpectedSize: d.Size, MaxSize: s.cfg.MaxFileSize,
			ChecksumType: typ, Checksum: d.Options.Checksum,
		})
		if errors.Is(err, transfer.ErrNoThirdPartyCopy) && ctx.Err() == nil {
			refusals = append(refusals, fmt.Sprintf("the %s refuses to %s (%v)", step.end, step.mode, err))
			continue
		}
		res = api.Result{Bytes: tr.Bytes, Started: tr.Started, Ended: tr.Ended, TransferMethod: step.method,
			ChecksumUnverified: tr.ChecksumUnverified}
		s.say(ctx, d, step.method, err)
		if err != nil {
			res.Error = failure(ctx, err, src)
			return res, "", true
		}
		res.Size, res.Checksum = tr.Bytes, tr.Checksum
		// The destination storage's own checksum, compared with the job's
		// (by post-processing) or the source's; or one computed by reading
		// the destination back; or none (ChecksumUnverified says why).
		switch {
		case tr.Checksum != "" && tr.ReadBack > 0:
			res.ChecksumSource = dtr.ChecksumFromStream
		case tr.Checksum != "" && tr.ChecksumUnverified == "":
			res.ChecksumSource = dtr.ChecksumFromStorage
		}
		return res, "", true
	}
	why := fmt.Sprintf("%s; %s", refusals[0], refusals[1])
	if len(why) > maxWhy {
		// Each refusal quotes at most 512 bytes of its answer; the DTR
		// record keeps no more than this of both.
		why = strings.ToValidUTF8(why[:maxWhy], "") + "…"
	}
	if mode == dtr.TPCOnly {
		return s.refused(ctx, d, "tpc is only, and no third-party copy could be made: "+why), "", true
	}
	method := dtr.TransferStreamed + ": " + why
	s.say(ctx, d, method, nil)
	return res, method, false
}

// refused is the result of a transfer whose tpc only cannot be honoured:
// PERMANENT_REMOTE, since the storages will answer the same next time.
func (s *Service) refused(ctx context.Context, d *dtr.DTR, why string) api.Result {
	s.say(ctx, d, "refused", errors.New(why))
	return api.Result{Error: &dtr.Failure{Kind: dtr.ErrPermanentRemote, Text: why, Location: dtr.LocationDestination}}
}

// say logs how a DTR's bytes move and marks its span with it.
func (s *Service) say(ctx context.Context, d *dtr.DTR, method string, err error) {
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("sluice.transfer_method", method))
	if err != nil {
		s.log.Info("third-party copy", "dtr", d.ID, "method", method, "tpc", d.Options.TPC, "error", err)
		return
	}
	s.log.Info("third-party copy", "dtr", d.ID, "method", method, "tpc", d.Options.TPC)
}

// schemeOf is the scheme of a URL, for messages.
func schemeOf(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme == "" {
		return "a URL without a scheme"
	}
	return u.Scheme + "://"
}
