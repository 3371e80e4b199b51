package chserver

import (
	"context"
	"errors"
	"time"
)

// errRunning is returned by Start when the server is running.
var errRunning = errors.New("already running")

// Backoff paces Supervise's restarts: the first waits Min, each next one
// twice as long, up to Max; a server that had stayed up for Reset before it
// exited is restarted after Min again. Zero fields mean 1s, 30s and 1m.
type Backoff struct {
	Min, Max, Reset time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Min <= 0 {
		b.Min = time.Second
	}
	if b.Max < b.Min {
		b.Max = max(30*time.Second, b.Min)
	}
	if b.Reset <= 0 {
		b.Reset = time.Minute
	}
	return b
}

// Supervise watches the server until ctx is done, and starts it again, on
// the same ports and data, whenever its process exits without Stop, Kill or
// Restart having been called: it logs the exit at ERROR, with the exit
// status and the end of what the server logged, and retries a failed
// restart with backoff. A server stopped on purpose is left stopped, and
// watched again once started.
//
// Run it in its own goroutine, and before stopping the server for good
// cancel ctx and wait for Supervise to return, so that the shutdown never
// races with a restart.
func (s *Server) Supervise(ctx context.Context, b Backoff) {
	b = b.withDefaults()
	delay := b.Min
	for {
		s.mu.Lock()
		p, started := s.proc, s.started
		s.mu.Unlock()
		if p == nil {
			select {
			case <-ctx.Done():
				return
			case <-started:
				continue
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-p.Done():
		}
		if !s.forget(p) {
			continue // stopped, killed or restarted on purpose
		}
		up := time.Since(p.readyAt)
		if up >= b.Reset {
			delay = b.Min
		}
		s.logger.Error("ClickHouse exited unexpectedly; restarting it", "pid", p.Pid, "status", exitStatus(p.Err()),
			"up_for", up.Round(time.Millisecond).String(), "restart_in", delay.String(), "logs", s.logTail(p.marks))
		for attempt := 1; ; attempt++ {
			select {
			case <-ctx.Done():
				return
			case <-time.After(delay):
			}
			delay = min(delay*2, b.Max)
			err := s.Start(ctx)
			if err == nil || errors.Is(err, errRunning) {
				s.logger.Warn("ClickHouse restarted after it exited", "attempt", attempt, "addr", s.Addr(), "pid", s.Pid())
				break
			}
			if ctx.Err() != nil {
				return
			}
			s.logger.Error("restart ClickHouse", "error", err, "attempt", attempt, "retry_in", delay.String())
		}
	}
}

// forget clears p, which has exited, as the server's process, and reports
// whether it still was: if not, Stop, Kill or Restart had let go of it.
func (s *Server) forget(p *process) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != p {
		return false
	}
	s.proc = nil
	removePIDFile(s.layout.pidFile(), p.Pid)
	return true
}

// exitStatus describes how a process ended, from its Wait error.
func exitStatus(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
