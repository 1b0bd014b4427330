// Package api is Sluice's wire contract with its clients: the subjects of
// the request/reply endpoints, and the requests, replies and job events
// that cross them. The services and the CLI both import it; no client
// imports a service to talk to it. It imports only the model (pkg/dtr,
// pkg/job).
package api

// The request/reply endpoints (nats.go micro services). Each is served on
// its plain subject, the operator's, and on <subject>.<user>, a user's
// own, which the NATS server lets only that user publish to (pkg/auth).
const (
	SubjectJobSubmit = "sluice.api.job.submit"
	SubjectJobStatus = "sluice.api.job.status"
	SubjectShares    = "sluice.api.shares"
	SubjectDTR       = "sluice.api.dtr"
	// SubjectRetrying answers a job's DTRs that wait for a retry.
	SubjectRetrying = "sluice.api.retrying"
	// Control endpoints of the scheduler.
	SubjectPriority    = "sluice.api.priority"
	SubjectCancel      = "sluice.api.cancel"
	SubjectReconfigure = "sluice.api.reconfigure"
)
