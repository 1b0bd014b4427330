// Package api is Sluice's wire contract: every subject, message, request,
// reply and event that crosses the bus, with one Grant and one Result (the
// scheduler's core decides and takes them too), the CloudEvent types, and
// the request/reply endpoints with their requests and replies. The services
// and the CLI both import it; no client imports a service to talk to it. It
// imports only the model (pkg/dtr, pkg/job). schemas/ is checked against it
// (schemas_test.go).
package api

// The request/reply endpoints (nats.go micro services). Each is served on
// its plain subject, the operator's, and on <subject>.<user>, a user's
// own, which the NATS server lets only that user publish to (pkg/auth).
const (
	SubjectJobSubmit = "sluice.api.job.submit"
	SubjectJobStatus = "sluice.api.job.status"
	// SubjectJobList lists jobs, the latest first.
	SubjectJobList = "sluice.api.job.list"
	SubjectShares  = "sluice.api.shares"
	SubjectDTR     = "sluice.api.dtr"
	// SubjectRetrying answers a job's DTRs that wait for a retry.
	SubjectRetrying = "sluice.api.retrying"
	// Control endpoints of the scheduler.
	SubjectPriority    = "sluice.api.priority"
	SubjectCancel      = "sluice.api.cancel"
	SubjectReconfigure = "sluice.api.reconfigure"
	// SubjectWorkers answers the worker processes the scheduler hears
	// from (operators and administrators only).
	SubjectWorkers = "sluice.api.workers"
	// SubjectLinks answers each link's concurrency limit as the per-link
	// optimizer set it (body: LinksRequest, may be empty).
	SubjectLinks = "sluice.api.links"
)
