package sketch

import "math/bits"

// numKeys is the number of keys, MinKey to MaxKey.
const numKeys = int(MaxKey) - int(MinKey) + 1

// Merger adds histograms up exactly, as sumMap does, in a dense array of
// every key: each bucket added costs one step, whatever the order. A bitmap
// marks the buckets in use, so that the sum is read out in key order
// without sorting (sorting the keys of each histogram taken was a third of
// the hour rollup's CPU); the keys of a sum of a few buckets (a minute of
// a group holds a few requests) are also listed, and read out sorted from
// the list. The zero value is an empty sum; a Merger is about 12 KB, meant
// to be reused.
type Merger struct {
	counts [numKeys]uint64
	// used has bit i%64 of word i/64 set when counts[i] is not zero; the
	// words from lo to hi (exclusive) are the only ones that may be.
	used   [(numKeys + 63) / 64]uint64
	lo, hi int
	n      int // buckets in use
	// few lists the keys of the buckets in use while there are at most
	// len(few).
	few        [8]int16
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
		w := i >> 6
		m.used[w] |= 1 << (i & 63)
		switch {
		case m.n == 0:
			m.lo, m.hi = w, w+1
		case w < m.lo:
			m.lo = w
		case w >= m.hi:
			m.hi = w + 1
		}
		if m.n < len(m.few) {
			m.few[m.n] = k
		}
		m.n++
	}
	m.counts[i] += n
}

// Add adds the histogram h, whose keys must lie in [MinKey, MaxKey]
// (Histogram's do), in any order.
func (m *Merger) Add(h Histogram) {
	if len(h.Keys) == 0 {
		return
	}
	counts := h.Counts[:len(h.Keys)]
	before := m.n
	lo, hi := len(m.used), 0 // the words of the buckets new to m
	for i, k := range h.Keys {
		c := counts[i]
		if c == 0 {
			continue
		}
		j := int(k) - int(MinKey)
		if m.counts[j] == 0 {
			w := j >> 6
			m.used[w] |= 1 << (j & 63)
			lo, hi = min(lo, w), max(hi, w+1)
			if m.n < len(m.few) {
				m.few[m.n] = k
			}
			m.n++
		}
		m.counts[j] += c
	}
	switch {
	case before == 0:
		m.lo, m.hi = lo, hi
	case m.n > before:
		m.lo, m.hi = min(m.lo, lo), max(m.hi, hi)
	}
}

// Take returns the sum so far and starts a new one. The histograms it
// returns share a few large arrays (one allocation per many small
// histograms, growing with use up to 16,384 buckets: a Merger taken from
// once allocates just what it returns); they do not change afterwards.
func (m *Merger) Take() Histogram {
	n := m.n
	if n == 0 {
		return Histogram{}
	}
	if cap(m.keyArena)-len(m.keyArena) < n {
		size := max(n, min(2*m.taken, 1<<14))
		m.keyArena = make([]int16, 0, size)
		m.countArena = make([]uint64, 0, size)
	}
	m.taken += n
	start := len(m.keyArena)
	end := start + n
	keys, counts := m.keyArena[start:end:end], m.countArena[start:end:end]
	m.keyArena, m.countArena = m.keyArena[:end], m.countArena[:end]
	m.n = 0
	if n <= len(m.few) {
		// Insertion sort of the few keys, then their counts.
		for i := 1; i < n; i++ {
			for j := i; j > 0 && m.few[j] < m.few[j-1]; j-- {
				m.few[j], m.few[j-1] = m.few[j-1], m.few[j]
			}
		}
		for j, k := range m.few[:n] {
			i := int(k) - int(MinKey)
			keys[j], counts[j] = k, m.counts[i]
			m.counts[i] = 0
			m.used[i>>6] = 0
		}
		return Histogram{Keys: keys, Counts: counts}
	}
	j := 0
	for w := m.lo; w < m.hi; w++ {
		for word := m.used[w]; word != 0; word &= word - 1 {
			i := w<<6 | bits.TrailingZeros64(word)
			keys[j], counts[j] = int16(i+int(MinKey)), m.counts[i]
			m.counts[i] = 0
			j++
		}
		m.used[w] = 0
	}
	return Histogram{Keys: keys, Counts: counts}
}
