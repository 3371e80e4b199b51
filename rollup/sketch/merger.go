package sketch

import "slices"

// Merger adds histograms up exactly, as sumMap does, in a dense array of
// every key: each bucket added costs one step, whatever the order, and the
// sum is sorted once when taken. The zero value is an empty sum; a Merger is
// about 12 KB, meant to be reused.
type Merger struct {
	counts     [int(MaxKey) - int(MinKey) + 1]uint64
	touched    []int16
	keyArena   []int16
	countArena []uint64
	taken      int // buckets handed out by Take so far
}

// AddKey counts n more values in bucket k, which must lie in [MinKey,
// MaxKey] (Key's results do).
func (m *Merger) AddKey(k int16, n uint64) {
	if n == 0 {
		return
	}
	i := int(k) - int(MinKey)
	if m.counts[i] == 0 {
		m.touched = append(m.touched, k)
	}
	m.counts[i] += n
}

// Add adds the histogram h.
func (m *Merger) Add(h Histogram) {
	for i, k := range h.Keys {
		m.AddKey(k, h.Counts[i])
	}
}

// Take returns the sum so far and starts a new one. The histograms it
// returns share a few large arrays (one allocation per many small
// histograms, growing with use up to 16,384 buckets: a Merger taken from
// once allocates just what it returns); they do not change afterwards.
func (m *Merger) Take() Histogram {
	slices.Sort(m.touched)
	n := len(m.touched)
	if cap(m.keyArena)-len(m.keyArena) < n {
		size := max(n, min(2*m.taken, 1<<14))
		m.keyArena = make([]int16, 0, size)
		m.countArena = make([]uint64, 0, size)
	}
	m.taken += n
	start := len(m.keyArena)
	for _, k := range m.touched {
		j := int(k) - int(MinKey)
		m.keyArena, m.countArena = append(m.keyArena, k), append(m.countArena, m.counts[j])
		m.counts[j] = 0
	}
	m.touched = m.touched[:0]
	end := len(m.keyArena)
	return Histogram{Keys: m.keyArena[start:end:end], Counts: m.countArena[start:end:end]}
}
