package api

import (
	"tokenmeter/ingest/otlp"
	meterv1 "tokenmeter/proto/tokenmeter/v1"
)

var _ otlp.Authorizer = (*Keys)(nil)

// AuthorizePublish implements otlp.Authorizer: the OTLP receivers take the
// same API keys, with the same roles, as PublishEvents (ingest and admin).
// It returns the tenant the key is bound to, "" for none.
func (k *Keys) AuthorizePublish(authorization string) (string, error) {
	p, err := k.authenticateHeader(authorization)
	if err != nil {
		return "", kindError{err, otlp.ErrUnauthenticated}
	}
	if err := checkRole(p, meterv1.IngestService_PublishEvents_FullMethodName); err != nil {
		return "", kindError{err, otlp.ErrPermissionDenied}
	}
	return p.TenantID, nil
}

// kindError is err, also matching kind with errors.Is, with err's message.
type kindError struct{ err, kind error }

func (e kindError) Error() string   { return e.err.Error() }
func (e kindError) Unwrap() []error { return []error{e.err, e.kind} }
