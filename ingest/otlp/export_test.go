package otlp

// ConvertJSON is the OTLP/HTTP JSON reader without a span limit (tests).
func (m Mapping) ConvertJSON(data []byte, keyTenant string) (Batch, error) {
	return m.convertJSON(data, keyTenant, 0)
}
