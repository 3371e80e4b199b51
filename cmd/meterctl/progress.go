package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress reports a replay on stderr: a bar redrawn in place on a
// terminal, a plain line every few seconds otherwise (logs, CI).
type progress struct {
	w     io.Writer
	tty   bool
	st    *stats
	every time.Duration
}

func newProgress(w io.Writer, tty bool, st *stats) *progress {
	p := &progress{w: w, tty: tty, st: st, every: 5 * time.Second}
	if tty {
		p.every = 200 * time.Millisecond
	}
	return p
}

// run reports until done is closed, then ends the bar's line.
func (p *progress) run(done <-chan struct{}) {
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			p.report()
		case <-done:
			if p.tty {
				p.report()
				fmt.Fprintln(p.w)
			}
			return
		}
	}
}

const barWidth = 30

func (p *progress) report() {
	sent := p.st.sent.Load()
	elapsed := time.Since(p.st.start)
	rate := float64(sent) / max(elapsed.Seconds(), 1e-9)
	frac := 0.0
	if p.st.total > 0 {
		frac = min(float64(sent)/float64(p.st.total), 1)
	}
	if !p.tty {
		fmt.Fprintf(p.w, "meterctl: %d/%d events (%.0f%%), %.0f events/s, %d rejected, %d retries\n",
			sent, p.st.total, 100*frac, rate, p.st.rejected.Load(), p.st.retries.Load())
		return
	}
	filled := int(frac * barWidth)
	bar := strings.Repeat("=", filled)
	if filled < barWidth {
		bar += ">" + strings.Repeat(" ", barWidth-filled-1)
	}
	eta := "--"
	if rate > 0 && sent > 0 {
		eta = time.Duration(float64(int64(p.st.total)-sent) / rate * float64(time.Second)).Round(time.Second).String()
	}
	// \r returns to the line's start; \x1b[K clears what a longer line left.
	fmt.Fprintf(p.w, "\r[%s] %3.0f%%  %d/%d  %.0f ev/s  rejected %d  retries %d  ETA %s\x1b[K",
		bar, 100*frac, sent, p.st.total, rate, p.st.rejected.Load(), p.st.retries.Load(), eta)
}

// isTerminal tells whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
