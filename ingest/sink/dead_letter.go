package sink

import "time"

// DeadLetter is a rejected record that could not be written to the
// dead-letter topic, kept in the store (table dead_letters) instead.
type DeadLetter struct {
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
	ReasonCode      string
	Reason          string
	OriginalSize    uint64
	OriginalSHA256  string // hex
	Key             []byte // at most the caller's bound
	Payload         []byte // the start of the value, at most the caller's bound
	Truncated       bool   // Payload is shorter than the value
	DLQError        string // why the dead-letter topic refused it
	RecordedAt      time.Time
}
