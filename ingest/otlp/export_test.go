package otlp

// InFlight is the number of OTLP/HTTP exports holding a slot (tests).
func (r *Receiver) InFlight() int { return len(r.slots) }
